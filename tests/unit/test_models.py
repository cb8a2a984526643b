"""Models on demand (api/models.py): loads, switches, unloads and sleep, over engines that
need no model file (a runtime over test_runtime's FakeEngine: its requests run until
ended), and the model routes in process (over the fake context's engine)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from llama_srb.api.app import create_app
from llama_srb.api.errors import APIError, api_error
from llama_srb.api.input.chat import ChatTemplate, ServedTemplate
from llama_srb.api.models import Models, ModelState, check_model
from llama_srb.cli import add_settings_flags, settings_from_args
from llama_srb.config import Settings
from llama_srb.engine.build import Submission
from llama_srb.engine.generation import Unloaded
from llama_srb.engine.runtime import Runtime
from llama_srb.loader import kv_fit_error
from llama_srb.served import Served
from tests.unit.fake_context import make_engine, served
from tests.unit.test_runtime import FakeEngine, face, make_request

SMOL = "smollm2-135m-instruct"
GEMMA = "gemma-3-270m-q4_k_m"  # the default's public name
CHAT = ServedTemplate("{{ messages[0].content }}", "the unit tests'", (), ChatTemplate("x"))


class Loads:
    """A loader that counts its loads and closes, each engine a runtime over FakeEngine."""

    def __init__(self, fail: set[str] | None = None, delay: float = 0.0) -> None:
        self.fail = fail or set()
        self.delay = delay
        self.loaded: list[str] = []
        self.closed: list[str] = []
        self.runtimes: list[Runtime] = []

    def __call__(self, settings: Settings) -> tuple[Served, ServedTemplate]:
        name = settings.model_name
        time.sleep(self.delay)
        if name in self.fail:
            raise ValueError(f"{name}: not a GGUF file")
        self.loaded.append(name)
        runtime = Runtime(FakeEngine())  # type: ignore[arg-type]
        runtime.start()
        self.runtimes.append(runtime)
        base = face(runtime)

        def close() -> bool:
            self.closed.append(name)
            return base.close()

        return Served(base.model, base.n_ctx, runtime, base.snapshot, base.watchdog, close), CHAT

    def stop(self) -> None:
        for runtime in self.runtimes:
            runtime.stop(10)


@pytest.fixture
def loads() -> Iterator[Loads]:
    made = Loads()
    yield made
    made.stop()


def two_models(**more: object) -> Settings:
    return Settings(models=[SMOL], **more)  # type: ignore[arg-type]


def test_settings_take_a_repeated_model_flag_and_a_comma_list() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    settings = settings_from_args(parser.parse_args(["--model", "gemma-3-270m", "--model", SMOL]))
    assert (settings.model, settings.models) == ("gemma-3-270m", [SMOL])
    assert Settings(models=f" {SMOL} ,").models == [SMOL]
    with pytest.raises(ValueError, match="neither a bundled model"):
        Settings(models=["no-such-model"])
    with pytest.raises(ValueError, match="not a folder"):
        Settings(models_dir=Path("/no/such/folder"))


def test_models_are_listed_by_name_and_an_unknown_one_is_a_404_naming_them(
    loads: Loads, tmp_path: Path
) -> None:
    (tmp_path / "prose-12b.gguf").write_bytes(b"GGUF")
    models = Models(two_models(models_dir=tmp_path), loads)
    assert [s.name for s in models.slots] == [GEMMA, SMOL, "prose-12b"]
    assert {s.state for s in models.slots} == {ModelState.available}
    (tmp_path / "later.gguf").write_bytes(b"GGUF")  # dropped in while serving
    assert models.slot("later").name == "later"
    with pytest.raises(APIError) as unknown:
        models.slot("gpt-4")
    assert unknown.value.status == 404 and unknown.value.code == "model_not_found"
    assert f"`{GEMMA}`" in unknown.value.message and "`later`" in unknown.value.message
    assert models.named("gpt-4") is None and models.named(SMOL) == SMOL


def test_two_requests_for_a_model_being_loaded_share_one_load(loads: Loads) -> None:
    loads.delay = 0.2

    async def scenario() -> list[str]:
        models = Models(two_models(), loads)

        async def request() -> str:
            async with models.use(SMOL) as slot:
                return slot.name

        return list(await asyncio.gather(request(), request(), request()))

    assert asyncio.run(scenario()) == [SMOL] * 3
    assert loads.loaded == [SMOL]


def test_loading_one_more_than_models_max_unloads_the_least_recently_used(loads: Loads) -> None:
    async def scenario() -> Models:
        models = Models(two_models(models_max=1), loads)
        async with models.use(None) as first:  # the default
            assert first.name == GEMMA
        async with models.use(SMOL) as second:
            assert second.state is ModelState.loaded
        return models

    models = asyncio.run(scenario())
    assert loads.loaded == [GEMMA, SMOL] and loads.closed == [GEMMA]
    states = {s.name: s.state for s in models.slots}
    assert states == {GEMMA: ModelState.sleeping, SMOL: ModelState.loaded}
    assert models.current().name == SMOL  # a request that names none gets the one in use


def test_an_unload_waits_for_a_route_that_holds_the_model(loads: Loads) -> None:
    """A route holds its model from its checks until its requests are submitted: the
    switch to another model begins only after."""

    async def scenario() -> list[str]:
        models = Models(two_models(models_max=1, unload_grace=30), loads)
        order: list[str] = []
        async with models.use(GEMMA):
            switch = asyncio.create_task(models.load(models.slot(SMOL)))
            await asyncio.sleep(0.3)
            order.append(f"held, {SMOL} {models.slot(SMOL).state.value}")
        await switch
        order.append(f"released, {SMOL} {models.slot(SMOL).state.value}")
        return order

    assert asyncio.run(scenario()) == [f"held, {SMOL} loading", f"released, {SMOL} loaded"]
    assert loads.closed == [GEMMA]


def test_requests_still_running_after_the_grace_end_with_model_unloaded(loads: Loads) -> None:
    async def scenario() -> BaseException:
        models = Models(two_models(models_max=1, unload_grace=0.2), loads)
        async with models.use(GEMMA) as slot:
            generation = slot.ready().runtime.generate(Submission(make_request()))
        await models.load(models.slot(SMOL))  # FakeEngine's request never ends by itself
        with pytest.raises(Unloaded) as ended:
            await generation.__anext__()
        return ended.value

    ended = asyncio.run(scenario())
    error = api_error(ended)
    assert (error.status, error.code) == (503, "model_unloaded")
    assert f"`{GEMMA}` was unloaded to load `{SMOL}`" in error.message
    assert "0.2 s (--unload-grace)" in error.message


def test_a_model_that_fails_to_load_says_why_and_the_next_request_tries_again(
    loads: Loads,
) -> None:
    loads.fail = {SMOL}

    async def scenario() -> tuple[APIError, Models]:
        models = Models(two_models(models_max=2), loads)
        async with models.use(GEMMA):
            pass
        with pytest.raises(APIError) as failed:
            async with models.use(SMOL):
                pass
        assert models.slot(SMOL).state is ModelState.failed
        async with models.use(GEMMA) as still:  # the running model keeps serving
            assert still.state is ModelState.loaded
        loads.fail = set()
        async with models.use(SMOL) as fixed:
            assert fixed.state is ModelState.loaded and fixed.error is None
        return failed.value, models

    failed, _ = asyncio.run(scenario())
    assert (failed.status, failed.code) == (503, "model_load_failed")
    assert f"model `{SMOL}` could not be loaded: ValueError: {SMOL}: not a GGUF file" == (
        failed.message
    )


def test_a_model_idle_past_sleep_idle_seconds_is_unloaded_and_comes_back(loads: Loads) -> None:
    async def scenario() -> list[ModelState]:
        models = Models(two_models(), loads)
        sleeper = asyncio.create_task(models.sleep_idle(0.3))
        seen = []
        async with models.use(SMOL) as slot:
            generation = slot.ready().runtime.generate(Submission(make_request()))
        await asyncio.sleep(0.8)
        seen.append(slot.state)  # a request still runs on it: it stays
        await generation.aclose()
        for _ in range(40):
            await asyncio.sleep(0.1)
            if slot.state is ModelState.sleeping:
                break
        seen.append(slot.state)
        async with models.use(SMOL):
            seen.append(slot.state)
        sleeper.cancel()
        return seen

    assert asyncio.run(scenario()) == [ModelState.loaded, ModelState.sleeping, ModelState.loaded]
    assert loads.loaded == [SMOL, SMOL]


def test_a_load_that_cannot_succeed_is_refused_before_another_is_unloaded(
    tmp_path: Path,
) -> None:
    def gguf(name: str, size: int) -> Settings:
        path = tmp_path / f"{name}.gguf"
        with path.open("wb") as sparse:  # its size on paper, nothing on disk
            sparse.write(b"GGUF")
            sparse.truncate(size)
        return Settings(model=str(path))

    big, small = gguf("big", 64 << 30), gguf("small", 4 << 30)
    with pytest.raises(APIError) as refused:
        check_model(big, [], 8 << 30)
    assert (refused.value.status, refused.value.code) == (503, "model_too_large")
    assert "needs 64.0 GiB for its weights and only 8.0 GiB" in refused.value.message
    with pytest.raises(APIError, match=r"only 12\.0 GiB"):  # what unloading `small` frees
        check_model(big, [small], 8 << 30)
    check_model(small, [big], 1 << 30)  # the big one's unload makes room
    check_model(big, [], None)  # memory unknown: the loader's own checks decide
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"<html>404</html>")
    with pytest.raises(APIError, match="is not a GGUF file") as bad:
        check_model(Settings(model=str(broken)), [], None)
    assert bad.value.code == "model_load_failed"
    broken.unlink()
    with pytest.raises(APIError, match="cannot be read"):
        check_model(Settings.model_construct(model=str(broken)), [], None)


# -- the routes, in process ----------------------------------------------------------------


@pytest.fixture
def app_of_two(tmp_path: Path) -> Iterator[tuple[TestClient, list[Runtime]]]:
    """The app with two models, each load an engine over the fake context; entered, so
    that its lifespan loads the default and runs the loads that routes start."""
    runtimes: list[Runtime] = []

    def load(settings: Settings) -> tuple[Served, ServedTemplate]:
        engine, _ = make_engine()
        runtime = Runtime(engine)
        runtime.start()
        runtimes.append(runtime)
        return served(engine, runtime), CHAT

    keys = ["admin:boss: k-boss", "alice: k-alice"]
    settings = Settings(models=[SMOL], max_n=8, api_key=keys, data_dir=tmp_path)
    app = create_app(settings, loader=load)
    with TestClient(app) as client:
        wait_for(lambda: app.state.srb.models.default.served is not None)
        yield client, runtimes


def test_the_api_document_is_built_at_start_up_not_by_the_first_request(
    app_of_two: tuple[TestClient, list[Runtime]],
) -> None:
    """FastAPI builds an included route's handler on its first match, and the request
    counter's labels read the OpenAPI document's paths: built while the model loads, no
    request pays for them (they cost a server's first ~40 ms and ~170 ms of its event
    loop after the first response)."""
    client, _ = app_of_two
    app = client.app
    assert isinstance(app, FastAPI)
    wait_for(lambda: app.openapi_schema is not None)  # no request was sent
    assert "/v1/completions" in app.openapi_schema["paths"]  # type: ignore[index]


BOSS = {"Authorization": "Bearer k-boss"}
ALICE = {"Authorization": "Bearer k-alice"}


def states(client: TestClient) -> dict[str, tuple[str, str]]:
    cards = client.get("/v1/models", headers=ALICE).json()["data"]
    return {c["id"]: (c["state"], c["status"]["value"]) for c in cards}


def test_a_request_naming_a_model_loads_it_and_the_lists_show_each_state(
    app_of_two: tuple[TestClient, list[Runtime]],
) -> None:
    client, _ = app_of_two
    assert states(client) == {GEMMA: ("loaded", "loaded"), SMOL: ("available", "unloaded")}
    body = {"model": SMOL, "prompt": "Once", "max_tokens": 2, "top_k": 8}
    answer = client.post("/v1/completions", json=body, headers=ALICE)
    assert answer.status_code == 200 and answer.json()["model"] == SMOL
    assert states(client)[SMOL] == ("loaded", "loaded")
    metrics = client.get("/metrics").text
    assert f'llama_srb_model_state{{model="{SMOL}",state="loaded"}} 1.0' in metrics
    assert f'llama_srb_model_loads_total{{model="{SMOL}"}} 1.0' in metrics
    # TabbyAPI's list and card, as SillyTavern's Tabby type asks for them (both headers)
    tabby = {"x-api-key": "k-alice", "Authorization": "Bearer k-alice"}
    listed = client.get("/v1/model/list", headers=tabby).json()
    assert [m["id"] for m in listed["data"]] == [GEMMA, SMOL]
    current = client.get("/v1/model", headers=tabby).json()
    assert current["id"] == SMOL and current["parameters"] == {"max_seq_len": 1024}
    assert (
        client.get("/models", headers=ALICE).json()
        == client.get("/v1/models", headers=ALICE).json()
    )
    unknown = client.post("/v1/completions", json={**body, "model": "gpt-4"}, headers=ALICE)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"


def test_loading_and_unloading_take_an_admin_key(
    app_of_two: tuple[TestClient, list[Runtime]],
) -> None:
    client, _ = app_of_two
    refused = client.post("/models/load", json={"model": SMOL}, headers=ALICE)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_key_required"
    assert client.get("/v1/auth/permission", headers=ALICE).json() == {"permission": "api"}
    assert client.get("/v1/auth/permission", headers={"x-admin-key": "k-boss"}).json() == {
        "permission": "admin"
    }
    assert client.post("/models/load", json={"model": SMOL}, headers=BOSS).json() == {
        "success": True
    }
    wait_for(lambda: states(client)[SMOL][0] == "loaded")
    again = client.post("/models/load", json={"model": SMOL}, headers=BOSS)
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    assert client.post("/models/unload", json={"model": SMOL}, headers=ALICE).status_code == 403
    assert client.post("/models/unload", json={"model": SMOL}, headers=BOSS).json() == {
        "success": True
    }
    wait_for(lambda: states(client)[SMOL] == ("sleeping", "sleeping"))
    gone = client.post("/models/unload", json={"model": SMOL}, headers=BOSS)
    assert gone.status_code == 400 and "is not loaded" in gone.json()["error"]["message"]
    missing = client.post("/models/load", json={"model": "nope"}, headers=BOSS)
    assert missing.status_code == 404


def test_tabby_s_load_streams_its_progress_and_its_unload_takes_no_body(
    app_of_two: tuple[TestClient, list[Runtime]],
) -> None:
    client, _ = app_of_two
    admin = {"x-admin-key": "k-boss"}  # the ST-tabbyAPI-loader extension's header
    with client.stream("POST", "/v1/model/load", json={"model_name": SMOL}, headers=admin) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[0].endswith('"module":0,"modules":1,"status":"processing"}')
    assert events[-1].endswith('"module":1,"modules":1,"status":"finished"}')
    assert states(client)[SMOL][0] == "loaded"
    with client.stream("POST", "/v1/model/load", json={"name": "nope"}, headers=admin) as r:
        assert r.status_code == 404  # the name is checked before the stream begins
    assert client.post("/v1/model/unload", headers=admin).json() is None
    wait_for(lambda: states(client)[SMOL][0] == "sleeping")


def test_a_streamed_request_whose_model_loads_first_reads_notices_then_its_answer(
    app_of_two: tuple[TestClient, list[Runtime]],
) -> None:
    client, _ = app_of_two
    body = {"model": SMOL, "prompt": "Once", "max_tokens": 2, "top_k": 8, "stream": True}
    with client.stream("POST", "/v1/completions", json=body, headers=ALICE) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[0].startswith(f": loading model {SMOL} (")
    chunks = [line for line in lines if line.startswith("data: {")]
    assert chunks and all(f'"model":"{SMOL}"' in c for c in chunks)
    assert lines[-1] == "data: [DONE]"


def wait_for(condition: object, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


def test_a_fixed_context_that_host_memory_cannot_back_is_refused_with_its_numbers() -> None:
    assert kv_fit_error(4096, 1 << 20, 8 << 30) is None  # 4 GiB of cells in 8
    error = kv_fit_error(16384, 1 << 20, 8 << 30)
    assert error == (
        "--n-ctx 16384 needs 16.0 GiB of KV cache and 8.0 GiB of memory are available:"
        " lower --n-ctx, or leave it out to fit it to memory"
    )
    assert kv_fit_error(1 << 20, 1 << 20, None) is None  # unknown: llama.cpp's own check


def test_another_origin_s_page_cannot_load_or_unload_a_model(tmp_path: Path) -> None:
    """Without keys the origin rules guard the admin routes (api/origins.py): a page of
    another site gets 403 before anything loads; a page of this machine may."""
    loads = Loads()
    app = create_app(Settings(models=[SMOL], data_dir=tmp_path), loader=loads)
    client = TestClient(app)
    evil, local = {"Origin": "https://evil.example"}, {"Origin": "http://localhost:8000"}
    for path, body in [("/models/load", {"model": SMOL}), ("/v1/model/load", {"model_name": SMOL})]:
        assert client.post(path, json=body, headers=evil).status_code == 403
    for path in ("/models/unload", "/v1/model/unload"):
        assert client.post(path, json={"model": SMOL}, headers=evil).status_code == 403
    assert loads.loaded == []
    assert client.get("/v1/auth/permission", headers=local).json() == {"permission": "admin"}
    loads.stop()
