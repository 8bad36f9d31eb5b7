"""WIKI_MINI: a small encyclopedia of a fictional world, with question-answer pairs about it.

The world is invented (seeded random towns, rivers, people, inventions and birds) on purpose: a model cannot
know the answers from pre-training, so a reward for answering them measures whether the agent searched.
Every question's answer is stated in exactly one passage, in words a keyword search can find; some questions
need two searches (the river of the town where a person was born).

    python -m agentfly.retrieval.corpus            # regenerate data/wiki_mini*.jsonl (deterministic)
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("data")
CORPUS_PATH = DATA / "wiki_mini.jsonl"
QA_PATH = DATA / "wiki_mini_qa.jsonl"

ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "r", "s", "st", "t", "th",
          "v", "w", "z", "sk", "tr", "ch", "sh", "gl", "pl"]
VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "ia", "y"]
CODAS = ["", "n", "r", "l", "s", "th", "m", "nd", "rk", "st", "x", "ld"]
TOWN_SUFFIX = ["ford", "wick", "holm", "by", "stead", "mere", "ton", "burg", "dal", "haven", "moor", "field"]
PROFESSIONS = ["astronomer", "engineer", "poet", "botanist", "cartographer", "composer", "physician",
               "architect", "chemist", "painter", "mathematician", "shipbuilder", "geologist", "weaver"]
PRODUCTS = ["salt", "copper", "wool", "glass", "cheese", "timber", "silk", "pottery", "honey", "paper", "iron",
            "olive oil", "cider", "linen", "clocks", "rope", "tea", "amber"]
INVENTION_KINDS = ["lens", "loom", "pump", "compass", "lamp", "clock", "press", "kiln", "telescope", "plough",
                   "water wheel", "barometer"]
COLOURS = ["red", "blue", "green", "grey", "golden", "black", "white", "brown", "violet", "orange"]
HABITATS = ["marshes", "pine forests", "sea cliffs", "river valleys", "high meadows", "salt flats", "oak woods"]
FOODS = ["seeds", "insects", "small fish", "berries", "snails", "worms", "nectar"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables))


@dataclass
class World:
    rng: random.Random
    used: set[str] = field(default_factory=set)

    def name(self, syllables: int = 2, suffix: str = "") -> str:
        while True:
            n = (word(self.rng, syllables) + suffix).capitalize()
            if n not in self.used and len(n) > 3:
                self.used.add(n)
                return n


def generate(seed: int = 0, n_provinces: int = 12, n_rivers: int = 40, n_towns: int = 650,
             n_people: int = 500, n_inventions: int = 300, n_birds: int = 180) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(passages, questions). Passages are {"id", "title", "text"}; questions {"id", "question", "answer",
    "passage", "hops", "split"}. About 3,000 passages and as many questions for the defaults."""
    rng = random.Random(f"wiki-mini:{seed}")
    world = World(rng)
    passages: list[dict[str, Any]] = []
    questions: list[dict[str, Any]] = []

    def passage(title: str, text: str) -> str:
        pid = f"p{len(passages):05d}"
        passages.append({"id": pid, "title": title, "text": text})
        return pid

    def ask(question: str, answer: str | int, pid: str, hops: int = 1) -> None:
        questions.append({"id": f"q{len(questions):05d}", "question": question, "answer": str(answer),
                          "passage": pid, "hops": hops})

    provinces = [world.name(3) for _ in range(n_provinces)]
    capitals: dict[str, str] = {}
    rivers = []
    for _ in range(n_rivers):
        name = world.name(2)
        length = rng.randint(40, 900)
        source = rng.choice(provinces)
        sea = world.name(2) + " Sea"
        pid = passage(f"{name} River", f"The {name} River is a river that rises in the hills of {source} province and "
                      f"flows for {length} kilometres before it reaches the {sea}. Barges carried goods on the "
                      f"{name} until the railways came.")
        ask(f"How long is the {name} River, in kilometres?", length, pid)
        ask(f"Into which sea does the {name} River flow?", sea, pid)
        rivers.append(name)

    towns: list[dict[str, Any]] = []
    for i in range(n_towns):
        name = world.name(2, rng.choice(TOWN_SUFFIX))
        province, river = rng.choice(provinces), rng.choice(rivers)
        founded, population = rng.randint(820, 1890), rng.randint(800, 240_000)
        founder = world.name(2) + " " + world.name(2)
        product, month = rng.choice(PRODUCTS), rng.choice(MONTHS)
        if province not in capitals:
            capitals[province] = name
        capital_note = f" It is the capital of {province} province." if capitals[province] == name else ""
        p1 = passage(f"{name} (history)", f"{name} is a town in {province} province. It was founded in {founded} by "
                     f"{founder}, who built the first mill there.{capital_note} The old town hall dates from "
                     f"{founded + rng.randint(30, 200)}.")
        p2 = passage(f"{name} (geography)", f"{name} lies on the banks of the {river} River. In the 2020 census "
                     f"{name} had a population of {population}. Its market is held every {month}.")
        p3 = passage(f"{name} (economy)", f"The economy of {name} rests on {product}. Merchants from {name} sold "
                     f"{product} across {province} province for centuries.")
        ask(f"In which year was {name} founded?", founded, p1)
        ask(f"Who founded the town of {name}?", founder, p1)
        ask(f"On which river does {name} lie?", river, p2)
        ask(f"What was the population of {name} in the 2020 census?", population, p2)
        ask(f"What is the economy of {name} based on?", product, p3)
        if i % 5 == 0:
            ask(f"In which month is the market of {name} held?", month, p2)
        towns.append({"name": name, "province": province, "river": river, "geo": p2})
    for province, capital in capitals.items():
        ask(f"What is the capital of {province} province?", capital,
            next(p["id"] for p in passages if p["title"] == f"{capital} (history)"))

    people: list[dict[str, Any]] = []
    for _ in range(n_people):
        name = world.name(2) + " " + world.name(2)
        town = rng.choice(towns)
        born, profession = rng.randint(1500, 1990), rng.choice(PROFESSIONS)
        teacher = rng.choice(people)["name"] if people and rng.random() < 0.5 else None
        learned = f" {name} studied under {teacher}." if teacher else ""
        p1 = passage(name, f"{name} (born {born} in {town['name']}) is a {profession} from {town['province']} "
                     f"province.{learned}")
        ask(f"In which year was {name} born?", born, p1)
        ask(f"In which town was {name} born?", town["name"], p1)
        ask(f"What was the profession of {name}?", profession, p1)
        if teacher:
            ask(f"Under whom did {name} study?", teacher, p1)
        ask(f"On which river lies the town where {name} was born?", town["river"], town["geo"], hops=2)
        people.append({"name": name, "profession": profession, "born": born, "page": p1})

    for _ in range(n_inventions):
        kind = rng.choice(INVENTION_KINDS)
        name = f"{world.name(2)} {kind}"
        person = rng.choice(people)
        year = person["born"] + rng.randint(22, 60)
        material = rng.choice(["brass", "oak", "glass", "iron", "bronze", "walnut", "steel"])
        p1 = passage(f"{name.capitalize()}", f"The {name} is a {kind} made of {material}, invented by {person['name']} "
                     f"in {year}. It was first shown at the fair of {rng.choice(towns)['name']}.")
        ask(f"Who invented the {name}?", person["name"], p1)
        ask(f"In which year was the {name} invented?", year, p1)
        ask(f"What material is the {name} made of?", material, p1)

    for _ in range(n_birds):
        name = f"{rng.choice(COLOURS)} {world.name(2).lower()}"
        wingspan, habitat, food = rng.randint(12, 190), rng.choice(HABITATS), rng.choice(FOODS)
        eggs = rng.randint(1, 9)
        p1 = passage(f"{name.capitalize()} (bird)", f"The {name} is a bird of the {habitat} of "
                     f"{rng.choice(provinces)} province. It has a wingspan of {wingspan} centimetres and feeds "
                     f"mainly on {food}.")
        p2 = passage(f"{name.capitalize()} (breeding)", f"The {name} lays {eggs} eggs in a nest of moss. Both "
                     f"parents feed the chicks.")
        ask(f"What is the wingspan of the {name}, in centimetres?", wingspan, p1)
        ask(f"What does the {name} mainly feed on?", food, p1)
        ask(f"How many eggs does the {name} lay?", eggs, p2)

    split_rng = random.Random(f"wiki-mini-split:{seed}")
    for q in questions:
        q["split"] = "test" if split_rng.random() < 0.2 else "train"
    return passages, questions


def write(seed: int = 0) -> tuple[int, int]:
    passages, questions = generate(seed)
    DATA.mkdir(exist_ok=True)
    with CORPUS_PATH.open("w") as f:
        for p in passages:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    with QA_PATH.open("w") as f:
        for q in questions:
            f.write(json.dumps(q, ensure_ascii=False) + "\n")
    return len(passages), len(questions)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    n_passages, n_questions = write(args.seed)
    print(f"wrote {n_passages} passages to {CORPUS_PATH} and {n_questions} questions to {QA_PATH}")


if __name__ == "__main__":
    main()
