"""Checkpoints out: a checkpoint downloads as a tar of its model files (never the trainer's pickled state), and
exports on a worker to a folder of the team that ``transformers`` loads with ``from_pretrained``; a file a job
swapped for a symlink is refused; another team's checkpoint is a 404 on the page and the API."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import wait_for
from webapp.jobs import paths

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentfly.models.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", hidden_size=32, num_layers=1, num_heads=2,
                      num_kv_heads=1, intermediate_size=64, vocab_size=512)


def save_real_checkpoint(job: Any, tiny_model: Path, step: int = 3) -> Any:
    """A checkpoint written by the trainer's own ``save_checkpoint`` into the job's folder, and its row."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.checkpoint import save_checkpoint
    from webapp.jobs.models import Checkpoint

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    path = save_checkpoint(paths.job_dir(job), step, model=model, tokenizer=tokenizer, state={"data": {}})
    return Checkpoint.objects.create(job=job, step=step, path=str(path))


@pytest.fixture
def job(alice: Any, team_a: Any, runs_dir: Path) -> Any:
    from webapp.jobs.models import TrainingJob

    return TrainingJob.objects.create(team=team_a, created_by=alice, name="trained", status="succeeded",
                                      config={"steps": 3})


def test_a_checkpoint_downloads_as_a_tar_of_its_model_files_without_the_trainer_state(
        alice_client: Any, alice_api: Any, job: Any, tiny_model: Path) -> None:
    save_real_checkpoint(job, tiny_model)
    for response in (alice_client.get(f"/jobs/{job.pk}/checkpoints/3.tar"),
                     alice_api.get(f"/api/jobs/{job.pk}/checkpoints/3/archive/")):
        assert response.status_code == 200
        assert response["Content-Disposition"] == f'attachment; filename="job-{job.pk}-step-3.tar"'
        with tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content))) as tar:
            names = {m.name.split("/", 1)[1] for m in tar.getmembers()}
            assert {m.name.split("/", 1)[0] for m in tar.getmembers()} == {f"job-{job.pk}-step-3"}
            weights = tar.extractfile(f"job-{job.pk}-step-3/model.safetensors").read()  # type: ignore[union-attr]
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(n.endswith(".pt") for n in names)
    assert weights == (paths.job_dir(job) / "checkpoint-000003" / "model.safetensors").read_bytes()


def test_a_model_file_swapped_for_a_symlink_is_refused_not_followed(
        alice_client: Any, job: Any, tiny_model: Path, tmp_path: Path) -> None:
    checkpoint = save_real_checkpoint(job, tiny_model)
    config = Path(checkpoint.path) / "config.json"
    (tmp_path / "secret.json").write_text('{"secret": "the worker\'s"}')
    config.unlink()
    config.symlink_to(tmp_path / "secret.json")
    response = alice_client.get(f"/jobs/{job.pk}/checkpoints/3.tar")
    assert response.status_code == 404 and "config.json" in response.content.decode()
    assert "cannot be read safely" in response.content.decode()


def test_another_teams_checkpoint_is_a_404_on_the_page_and_the_api(
        bob_client: Any, bob_api: Any, job: Any, tiny_model: Path) -> None:
    save_real_checkpoint(job, tiny_model)
    assert bob_client.get(f"/jobs/{job.pk}/checkpoints/3.tar").status_code == 404
    assert bob_client.post(f"/jobs/{job.pk}/checkpoints/3/export/").status_code == 404
    assert bob_api.get(f"/api/jobs/{job.pk}/checkpoints/3/archive/").status_code == 404
    assert bob_api.post(f"/api/jobs/{job.pk}/checkpoints/3/export/").status_code == 404


@pytest.mark.slow
def test_an_exported_checkpoint_loads_with_from_pretrained_and_chats_with_its_template(
        transactional_db: None, worker: Any, alice_api: Any, team_a: Any, alice: Any, runs_dir: Path,
        tiny_model: Path) -> None:
    import torch
    from celery.result import AsyncResult
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from webapp.celery import app
    from webapp.jobs.models import TrainingJob

    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="trained", status="succeeded",
                                     config={"steps": 3})
    save_real_checkpoint(job, tiny_model)
    queued = alice_api.post(f"/api/jobs/{job.pk}/checkpoints/3/export/")
    assert queued.status_code == 202, queued.content
    target = Path(queued.json()["path"])
    assert target == runs_dir / "team-a" / "exports" / f"job-{job.pk}-step-3"
    wait_for(lambda: alice_api.get(f"/api/jobs/{job.pk}/checkpoints/3/export/").json()["exported"], 60,
             "the worker to export the checkpoint")
    assert not list(target.glob("*.pt"))

    model = AutoModelForCausalLM.from_pretrained(target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    original = AutoModelForCausalLM.from_pretrained(tiny_model)
    for (name, p), q in zip(model.state_dict().items(), original.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                           add_generation_prompt=True)
    assert "<|im_start|>user" in prompt

    # Exported again, it replaces the first export whole (no leftovers of either copy).
    again = alice_api.post(f"/api/jobs/{job.pk}/checkpoints/3/export/").json()
    assert AsyncResult(again["task"], app=app).get(timeout=60)["path"] == str(target)
    # (Other tests of the session export their own jobs into the same team folder: this job's entries only,
    # its partial and replaced copies included, which carry the same name.)
    mine = [p.name for p in (runs_dir / "team-a" / "exports").iterdir() if f"job-{job.pk}-step-" in p.name]
    assert mine == [target.name]
    assert alice_api.get(f"/api/jobs/{job.pk}/checkpoints/3/export/?task={again['task']}").json() == {
        "exported": True, "path": str(target)}
    shutil.rmtree(runs_dir / "team-a")
