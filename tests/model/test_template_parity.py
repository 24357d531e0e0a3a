"""The worker's chat templates render byte for byte as transformers' apply_chat_template.

transformers runs in .venv-tools (model_tools.template_parity, a subprocess); the
serving side renders the same folders with worker_service.core.tokenizer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.model.test_parity import run_tools
from tests.models import prepared_model_dir
from worker_service.core.errors import InvalidWorkerField
from worker_service.core.tokenizer import Tokenizer

CONVERSATIONS = [
    [["user", "What is the capital of France? Answer in one sentence."]],
    [["system", "You are terse."], ["user", "Hi!"], ["assistant", "Hello."], ["user", "Bye"]],
    [["user", "héllo wörld 日本語 🙂 <b>&amp;</b> \"quoted\"\n\ttabs  "]],
    [["user", ""]],
    [["assistant", "I start"], ["user", "then you"], ["user", "twice"]],
    [["tool", "not a role every template takes"]],
]

# Templates that exercise what transformers' environment adds to plain jinja.
TEMPLATES = {
    "loopcontrols": (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% if loop.index > 3 %}{% break %}{% endif %}"
        "<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"),
    "generation-tag": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content }}{{ eos_token }}{% endgeneration %}{% else %}{{ bos_token }}{{ m.content }}"
        "{% endif %}{% endfor %}"),
    "filters-and-globals": (
        "{{ messages | tojson }}\n{{ messages[0] | tojson(indent=2, sort_keys=True) }}\n"
        "{{ messages | tojson(separators=(',', ':')) }}\n{{ unk_token }} {{ pad_token }} "
        "{{ tools is none }} {{ documents is none }}\n{% set ns = namespace(count=0) %}"
        "{% for m in messages %}{% set ns.count = ns.count + m.content | length %}{% endfor %}"
        "{{ ns.count }} {{ dict(a=1, b=[2]) | tojson }}\n"
        "  {%- if messages[0].role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"),
}


def folder_with_template(root: Path, name: str, template: str | None) -> Path:
    src = prepared_model_dir("tiny-llama")
    folder = root / name
    folder.mkdir()
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(src / file, folder / file)
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    return folder


def ours(folder: Path, conversation: list[list[str]]) -> object:
    try:
        return Tokenizer(folder).render_chat([tuple(turn) for turn in conversation])
    except InvalidWorkerField as exc:
        return {"error": str(exc)}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[list[Path], dict]:
    root = tmp_path_factory.mktemp("templates")
    folders = [folder_with_template(root, "smollm2", None)]
    folders += [folder_with_template(root, name, t) for name, t in TEMPLATES.items()]
    request = json.dumps({"folders": [str(f) for f in folders], "conversations": CONVERSATIONS})
    result = run_tools("-m", "model_tools.template_parity", timeout_s=300, stdin=request)
    assert result.returncode == 0, result.stderr[-4000:]
    return folders, json.loads(result.stdout)


@pytest.mark.parametrize("name", ["smollm2", *TEMPLATES])
def test_chat_template_renders_byte_for_byte_as_transformers(rendered, name):
    folders, theirs = rendered
    folder = next(f for f in folders if f.name == name)
    for conversation, expected in zip(CONVERSATIONS, theirs[str(folder)], strict=True):
        got = ours(folder, conversation)
        if isinstance(expected, dict):  # transformers refused it: so must we
            assert isinstance(got, dict), (conversation, got, expected)
        else:
            assert got == expected, conversation


def test_the_parity_fixtures_cover_a_refusal_and_several_templates(rendered):
    # Guards the test above: it compares real renderings, including one error.
    _, theirs = rendered
    texts = [t for out in theirs.values() for t in out]
    assert any(isinstance(t, dict) for t in texts)
    assert len({t for t in texts if isinstance(t, str)}) > 10
