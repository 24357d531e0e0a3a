"""The Python client and the CLI asking for a constraint and log-probabilities, through real
processes (a scheduler and a worker on the tiny model). The tiny model's weights are random:
only the shapes and validity are checked, never the content."""

from __future__ import annotations

import json
import subprocess

import jsonschema
import pytest
from ortserve_client import Client

from devtools.cluster import LocalCluster, model_cache
from tests.e2e.conftest import BIN

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

# NOTE: every value is bounded (a small integer, a boolean, an enum), so even random weights
# complete the object within a few dozen tokens.
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                   "ok": {"type": "boolean"},
                   "role": {"enum": ["admin", "user"]}},
    "required": ["n", "ok", "role"],
    "additionalProperties": False,
}
PROMPT = "Describe a user as JSON."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model_dir = model_cache() / "models" / "tiny-llama"
    if not (model_dir / "genai_config.json").exists():
        pytest.fail(f"the tiny model is not prepared at {model_dir}: run `make tiny-model`")
    cluster = LocalCluster(model_dir=model_dir, workers=1, threads=1, kv_capacities=["4MiB"],
                           log_dir=tmp_path_factory.mktemp("logs-client-structured")).start()
    yield cluster
    cluster.stop()


@pytest.mark.parametrize("direct", [False, True], ids=["relayed", "direct"])
def test_a_json_schema_generation_parses_and_reports_a_satisfied_constraint(tiny, direct):
    with Client(tiny.address, timeout_s=120, direct=direct) as client:
        result = client.generate(PROMPT, json_schema=SCHEMA, max_new_tokens=64)
    jsonschema.validate(json.loads(result.text), SCHEMA)
    assert result.finish_reason in ("CONSTRAINT_COMPLETE", "EOS"), result.text
    assert result.constraint is not None and result.constraint.satisfied, result.constraint
    assert result.constraint.reason == "" and result.logprobs == ()


def test_logprobs_2_gives_each_token_its_logprob_and_two_alternatives(tiny):
    with Client(tiny.address, timeout_s=120) as client:
        stream = client.stream(PROMPT, max_new_tokens=12, min_new_tokens=12, logprobs=2)
        chunks = list(stream)
    result = stream.result
    assert [len(c.logprobs) for c in chunks] == [len(c.token_ids) for c in chunks]
    assert len(result.logprobs) == len(result.token_ids) == 12
    assert [lp.token_id for lp in result.logprobs] == list(result.token_ids)
    for lp in result.logprobs:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 2
        top = [t.logprob for t in lp.top_logprobs]
        assert all(x <= 0 for x in top) and top == sorted(top, reverse=True)
        assert lp.logprob <= top[0]  # greedy may tie; it never beats the likeliest
    assert result.constraint is None


def cli(address: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ortserve"), "--address", address, "--timeout", "120",
                           "generate", PROMPT, *args], capture_output=True, text=True, timeout=180)


def test_the_cli_prints_json_with_the_constraint_result_and_logprobs_on_stdout(tiny):
    out = cli(tiny.address, "--json-schema", json.dumps(SCHEMA), "--logprobs", "1", "--json",
              "--max-new-tokens", "64")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)  # stdout is the one JSON object, nothing else
    jsonschema.validate(json.loads(doc["text"]), SCHEMA)
    assert doc["constraint"] == {"satisfied": True, "reason": ""}
    assert len(doc["logprobs"]) == len(doc["token_ids"]) > 0
    assert all(lp["logprob"] <= 0 and len(lp["top_logprobs"]) == 1 for lp in doc["logprobs"])


def test_the_cli_says_on_stderr_when_the_output_ends_before_its_constraint(tiny):
    # Four tokens cannot spell 200 letters: LENGTH, not satisfied, never silently.
    out = cli(tiny.address, "--regex", "[a-z]{200}", "--max-new-tokens", "4", "--stats")
    assert out.returncode == 0, out.stderr
    assert "CONSTRAINT NOT SATISFIED" not in out.stdout and "stats:" not in out.stdout
    assert "ortserve: CONSTRAINT NOT SATISFIED" in out.stderr
    assert "stats: constraint satisfied=false reason=" in out.stderr
