"""Build a tiny local model for CPU tests and demos: a Qwen2-architecture causal LM and a BPE tokenizer
trained here, saved with ``save_pretrained`` so that loading takes the same ``from_pretrained`` path as
any real model. Nothing is downloaded.

    python -m agentfly.models.tiny runs/tiny --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Single tokens for the tool-call markup (as Qwen2.5 has them) make the format cheap to learn.
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
# Splits words, single digits (so numbers are spelled digit by digit), punctuation runs and whitespace.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
STAMP = "agentfly-tiny.json"


def chat_template() -> str:
    """The Jinja chat template shipped with AgentFly (Qwen2.5 / Hermes tool-calling convention)."""
    return resources.files("agentfly.models").joinpath("templates/hermes_tools.jinja").read_text()


def training_corpus(seed: int, n: int = 3000) -> list[str]:
    """Text that covers the chat markup, tool schemas and task formats the tiny model will see."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from agentfly.tasks import arithmetic
    from agentfly.tools.builtin import calculator

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
    template = env.from_string(chat_template())
    texts = []
    for i, sample in enumerate(arithmetic.generate(n, seed=seed, split="tokenizer")):
        messages = arithmetic.demonstration(sample)
        if i % 3 == 0:
            messages = [{"role": "system", "content": "You are a helpful assistant. Use tools when they help."},
                        *messages]
        texts.append(template.render(messages=messages, tools=[calculator.schema], add_generation_prompt=False))
    texts.append("Thought: I should use a tool.\nAction: calculator\nAction Input: {}\nObservation: \nFinal Answer: ")
    texts.append("Error: invalid arguments for tool unknown tool timed out raised could not parse JSON")
    return texts


def train_tokenizer(texts: list[str], vocab_size: int, model_max_length: int = 1024) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=chat_template(),
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(MARKUP_TOKENS)
    return fast


def build_tiny(
    path: str | os.PathLike[str],
    seed: int = 0,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    vocab_size: int = 2048,
    max_position_embeddings: int = 1024,
    init_std: float = 0.02,
    overwrite: bool = False,
) -> Path:
    """Build (or reuse) a tiny Qwen2 model and tokenizer in ``path``; return the path.

    An existing build with the same settings is reused; ``overwrite=True`` rebuilds it.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    settings = {
        "seed": seed, "hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads,
        "num_kv_heads": num_kv_heads, "intermediate_size": intermediate_size, "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings, "init_std": init_std,
    }
    stamp = path / STAMP
    if not overwrite and stamp.exists() and json.loads(stamp.read_text()) == settings:
        return path
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError("hidden_size must divide by num_heads, and num_heads by num_kv_heads")
    tokenizer = train_tokenizer(training_corpus(seed), vocab_size, max_position_embeddings)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=init_std,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=eot,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=[im_end, eot], pad_token_id=eot)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    stamp.write_text(json.dumps(settings))
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build the tiny local model and tokenizer.")
    ap.add_argument("path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args(argv)
    print(build_tiny(args.path, args.seed, overwrite=args.overwrite))


if __name__ == "__main__":
    main()
