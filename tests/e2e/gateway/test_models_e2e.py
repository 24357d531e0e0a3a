"""Two models behind one scheduler, real processes: each request is answered by the model it names.

The risk: placement by the most free bytes whatever the model would serve requests
for one model with the other. The tiny worker here gets far more KV than the
SmolLM2 worker, so such a rule would send every SmolLM2 request to the tiny model.
"""

from __future__ import annotations

import grpc
import openai
import pytest
from ortserve_client import Client
from ortserve_client.chat import ChatSession
from ortserve_client.cli import run as cli_run
from ortserve_client.errors import InvalidRequest, OrtserveError

from devtools.cluster import LocalCluster, stop_service
from ortserve.v1 import types_pb2
from tests.e2e.gateway.test_gateway_e2e import openai_client, start_gateway
from tests.models import prepared_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

TINY, SMOL = "tiny-llama", "smollm2-135m-instruct-int4"
HI = [("user", "Say hi.")]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    tiny, smol = prepared_model_dir(TINY), prepared_model_dir(SMOL)
    cluster = LocalCluster(model_dir=tiny, workers=2, model_dirs=[tiny, smol],
                           kv_capacities=["512MiB", "64MiB"],
                           log_dir=tmp_path_factory.mktemp("logs-two-models")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def worker_of(two_models) -> dict[str, str]:
    """Model name -> the id of the one worker serving it (from the workers' registrations)."""
    with Client(two_models.address, timeout_s=30) as client:
        return {w.model: w.worker_id for w in client.budget().workers}


@pytest.fixture(scope="module")
def gateway(two_models, tmp_path_factory):
    service = start_gateway(tmp_path_factory, two_models.address)
    yield service
    stop_service(service)


def test_the_workers_register_their_folders_names_and_get_budget_sums_per_model(two_models,
                                                                                worker_of):
    assert set(worker_of) == {TINY, SMOL}
    with Client(two_models.address, timeout_s=30) as client:
        budget = client.budget()
    assert [m.model for m in budget.models] == sorted([TINY, SMOL])
    by_model = {m.model: m for m in budget.models}
    for w in budget.workers:
        m = by_model[w.model]
        assert (m.workers, m.capacity_bytes, m.context_length) == (1, w.capacity_bytes,
                                                                   w.context_length)


@pytest.mark.parametrize("model", [TINY, SMOL])
def test_each_request_is_answered_by_its_models_worker_only(two_models, worker_of, model):
    with Client(two_models.address, timeout_s=120) as client:
        for prompt in ({"chat": HI}, {"prompt": "Hello"}):  # chat and text: each tokenized by it
            for _ in range(2):
                result = client.generate(**prompt, max_new_tokens=3, model=model)
                assert result.model == model and result.admission.model == model
                assert result.worker_id == worker_of[model] == result.admission.worker_id
        adm = client.admit(chat=HI, max_new_tokens=3, model=model)  # Admit (dry run) too
        assert adm.decision == "ADMITTED" and adm.worker_id == worker_of[model]
        assert adm.model == model


def test_an_unknown_model_is_not_found_listing_the_served_ones(two_models):
    with Client(two_models.address, timeout_s=30) as client:
        for call in (lambda: client.generate(chat=HI, max_new_tokens=3, model="gpt-4o"),
                     lambda: client.admit(chat=HI, max_new_tokens=3, model="gpt-4o")):
            with pytest.raises(OrtserveError) as err:
                call()
            assert err.value.code == grpc.StatusCode.NOT_FOUND
            assert err.value.error_info().reason == "MODEL_NOT_FOUND"
            assert TINY in err.value.message and SMOL in err.value.message
            assert "gpt-4o" in err.value.message
            assert err.value.error_info().metadata["served_models"] == f"{SMOL},{TINY}"


def test_an_empty_model_is_invalid_argument_listing_the_served_ones(two_models):
    with Client(two_models.address, timeout_s=30) as client:
        with pytest.raises(InvalidRequest) as err:
            client.generate(chat=HI, max_new_tokens=3)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == "model"
        assert TINY in err.value.message and SMOL in err.value.message
        with pytest.raises(InvalidRequest) as err:
            client.admit(chat=HI, max_new_tokens=3)
        assert err.value.field == "request.model"


def test_a_session_is_bound_to_its_model_and_refuses_a_turn_for_another(two_models, worker_of):
    with Client(two_models.address, timeout_s=120) as client:
        session = ChatSession(client, SMOL)
        try:
            assert session.info.worker_id == worker_of[SMOL] and session.info.model == SMOL
            stream = session.turn(HI, max_new_tokens=2)
            for _ in stream:
                pass
            assert stream.result.worker_id == worker_of[SMOL]
            assert stream.result.model == SMOL
            with pytest.raises(InvalidRequest) as err:
                for _ in session.turn(HI, max_new_tokens=2, model=TINY):
                    pass
            assert err.value.field == "request.model" and SMOL in err.value.message
        finally:
            session.close()
        with pytest.raises(InvalidRequest) as err:  # no model named, two served
            ChatSession(client)
        assert err.value.field == "model" and TINY in err.value.message
        with pytest.raises(OrtserveError) as err:
            ChatSession(client, "nope")
        assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_the_cli_passes_model_and_its_stats_show_the_model_that_answered(two_models, capsys):
    code = cli_run(["--address", two_models.address, "--timeout", "120", "generate", "Hi",
                    "--chat", "--max-new-tokens", "2", "--model", SMOL, "--stats"])
    assert code == 0
    assert f"model={SMOL}" in capsys.readouterr().err
    code = cli_run(["--address", two_models.address, "generate", "Hi", "--model", "nope"])
    err = capsys.readouterr().err
    assert code == 1 and "NOT_FOUND" in err and TINY in err and SMOL in err


def test_the_gateway_lists_both_models_and_each_chat_is_answered_by_its_model(gateway, worker_of):
    client = openai_client(gateway, max_retries=0)
    assert sorted(m.id for m in client.models.list().data) == sorted([TINY, SMOL])
    for model in (TINY, SMOL):
        body = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=3)
        assert body.model == model
        ext = body.model_extra["ortserve"]
        assert ext["model"] == model and ext["worker_id"] == worker_of[model]
        assert ext["finished"]["worker_id"] == worker_of[model]
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o",
                                       messages=[{"role": "user", "content": "Hi"}])
    assert err.value.code == "model_not_found" and err.value.param == "model"
    assert TINY in err.value.message and SMOL in err.value.message


def test_grpc_generate_with_a_model_field_reaches_that_model(two_models, worker_of):
    with Client(two_models.address) as client:
        events = list(client._stub.Generate(types_pb2.GenerateRequest(
            token_ids=types_pb2.TokenIds(ids=[1, 2, 3]), max_new_tokens=2, model=TINY),
            timeout=120))
    assert events[0].admission.model == TINY
    assert events[-1].finished.worker_id == worker_of[TINY]
