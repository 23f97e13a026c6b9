"""onnxfuse on Ray (fleet/): a real local cluster, a head and two worker nodes on loopback, each worker node with
one CPU and one timing slot. Measured runs use fake timings installed in the worker processes (and a stepping
clock), so what is kept does not depend on how busy the machine is; outputs are compared byte for byte with a
run on one machine (batch.optimize_many) with the same decisions."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import pytest

ray = pytest.importorskip("ray")
from conftest import MODELS, fake_interleaved, one_generation, stepping_clock  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from onnxfuse import OptimizeOptions  # noqa: E402
from onnxfuse.batch import collect, optimize_many  # noqa: E402
from onnxfuse.fleet import TIMING_SLOT, optimize_on_ray  # noqa: E402

NODE = {"num_cpus": 1, "resources": {TIMING_SLOT: 1}, "object_store_memory": 80 << 20}
ZOO = ["cnn_small.onnx", "transformer_small.onnx"]


@pytest.fixture(scope="module")
def cluster():
    fast_death = {"health_check_period_ms": 500, "health_check_failure_threshold": 2}  # a killed node: seconds
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 80 << 20,
                                                      "_system_config": fast_death})
    workers = [c.add_node(**NODE), c.add_node(**NODE)]
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
    for module in (__name__, "conftest"):  # the workers cannot import these files: their functions go by value
        ray.cloudpickle.register_pickle_by_value(sys.modules[module])
    c.wait_for_nodes()
    c.workers = workers
    yield c
    ray.shutdown()
    c.shutdown()


def fake_timings() -> None:
    """In a worker process, what conftest's fake_timer installs in this one: fake region and whole-model timings
    and a clock that advances 0.1 ms per reading."""
    from onnxfuse.select import region_run

    region_run.interleave = fake = fake_interleaved()
    region_run.in_generations = one_generation(fake)
    time.perf_counter = stepping_clock(1e-4)


def zoo(tmp_path, names=ZOO) -> list[str]:
    folder = tmp_path / "zoo"
    folder.mkdir(exist_ok=True)
    for n in names:
        shutil.copy(os.path.join(MODELS, n), folder / n)
    return [str(folder / n) for n in names]


def files_of(folder) -> dict[str, bytes]:
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))}


def sources(results: list[dict]) -> list[str]:
    return sorted({g["source"] for d in results for g in (d["measure"] or {}).get("groups", [])})


def test_measured_on_ray_matches_one_machine_and_a_second_run_times_nothing(cluster, tmp_path, monkeypatch,
                                                                             fake_timer):
    inputs = zoo(tmp_path)
    opts = OptimizeOptions()
    fake_timer()  # the serial run, in this process, on the same fake timings
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path / "serial-cache"))
    serial = optimize_many(collect(inputs, str(tmp_path / "serial")), opts, 1)
    assert all(d["error"] is None for d in serial)
    assert "timed" in sources(serial)

    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(tmp_path / "fleet-cache"))  # the driver's own, empty
    first = optimize_on_ray(collect(inputs, str(tmp_path / "ray1")), opts, setup=fake_timings)
    assert [d["error"] for d in first] == [None] * len(ZOO)
    assert files_of(tmp_path / "ray1") == files_of(tmp_path / "serial")
    assert "timed" in sources(first)
    assert all(d["node"]["measured"] and d["node"]["id"] for d in first if d["measure"])
    assert {d["node"]["id"] for d in first} <= {n["NodeID"] for n in ray.nodes()}
    saved = json.load(open(tmp_path / "fleet-cache" / "decisions.json"))["decisions"]
    assert saved  # persisted to the driver's file

    # a second run (a new actor, seeded from the driver's file) reuses every decision: nothing is timed
    second = optimize_on_ray(collect(inputs, str(tmp_path / "ray2")), opts, setup=fake_timings)
    assert [d["error"] for d in second] == [None] * len(ZOO)
    assert "timed" not in sources(second)
    assert files_of(tmp_path / "ray2") == files_of(tmp_path / "ray1")


def other_processor() -> None:
    """In a worker process: fake timings on a node of another processor model."""
    from onnxfuse.select import decision_cache

    fake_timings()
    decision_cache._processor = lambda: "Another CPU @ 1.0GHz"


def test_a_node_of_another_processor_model_decides_afresh(cluster, tmp_path):
    inputs = zoo(tmp_path, ["cnn_small.onnx"])
    opts = OptimizeOptions()
    first = optimize_on_ray(collect(inputs, str(tmp_path / "a")), opts, setup=fake_timings)
    assert "timed" in sources(first)
    other = optimize_on_ray(collect(inputs, str(tmp_path / "b")), opts, setup=other_processor)
    assert "timed" in sources(other)  # the first run's decisions are not this processor's
    again = optimize_on_ray(collect(inputs, str(tmp_path / "c")), opts, setup=fake_timings)
    assert "timed" not in sources(again)  # each processor model's decisions are kept side by side
    assert files_of(tmp_path / "c") == files_of(tmp_path / "a")


def test_shipped_inputs_give_the_same_bytes(cluster, tmp_path):
    """Inputs sent through the object store (as to a node that does not see the driver's files), an
    external-data model with its data file too, are laid out in the worker's private folder; the outputs (model
    and data file) are the serial run's bytes, and the result names the driver's files."""
    inputs = zoo(tmp_path, ["cnn_small.onnx"])
    styles = os.path.join(MODELS, "styles")
    for n in ("bert_ir7_op13_external_data.onnx", "bert_ir7_op13_external_data.weights"):
        shutil.copy(os.path.join(styles, n), tmp_path / "zoo" / n)
    inputs.append(str(tmp_path / "zoo" / "bert_ir7_op13_external_data.onnx"))
    opts = OptimizeOptions(measure=False)
    serial = optimize_many(collect(inputs, str(tmp_path / "serial")), opts, 1)
    shipped = optimize_on_ray(collect(inputs, str(tmp_path / "ray")), opts, ship=True)
    assert [d["error"] for d in shipped] == [None, None]
    assert "bert_ir7_op13_external_data.onnx.data" in os.listdir(tmp_path / "ray")
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "serial")
    assert [d["input"] for d in shipped] == inputs
    assert [d["output"] for d in shipped] == [str(tmp_path / "ray" / os.path.basename(p)) for p in inputs]
    assert [d["written"] for d in shipped] == [[w.replace("serial", "ray") for w in d["written"]] for d in serial]
    assert "onnxfuse-ray-" not in json.dumps(shipped)  # no name of the worker's private folder


def test_a_bad_model_fails_alone_with_its_line(cluster, tmp_path, cli):
    inputs = zoo(tmp_path, ["cnn_small.onnx", "if_subgraph.onnx"])
    bad = tmp_path / "zoo" / "broken.onnx"
    bad.write_bytes(b"not a model")
    code, out, err = cli("optimize", *inputs, str(bad), str(tmp_path / "out"), "--ray", "auto", "--json")
    assert code == 1
    results = json.loads(out)
    assert [d["error"] is None for d in results] == [True, True, False]
    failure = results[2]
    assert failure["input"] == str(bad) and failure["output"] is None
    assert str(bad) in failure["error"] and "\n" not in failure["error"]
    assert sorted(os.listdir(tmp_path / "out")) == ["cnn_small.onnx", "if_subgraph.onnx"]
    jobs_code, jobs_out, _ = cli("optimize", *inputs, str(bad), str(tmp_path / "out-jobs"), "--jobs", "1",
                                 "--json")
    assert jobs_code == code
    jobs = json.loads(jobs_out)
    assert [sorted(set(d) - {"node"}) for d in results] == [sorted(d) for d in jobs]  # the same shape
    assert [d["error"] for d in results] == [d["error"] for d in jobs]


def test_ctrl_c_cancels_and_leaves_only_whole_outputs(cluster, tmp_path):
    inputs = zoo(tmp_path, ["cnn_small.onnx", "transformer_small.onnx", "if_subgraph.onnx", "transformer_op18.onnx"])
    opts = OptimizeOptions(measure=False)
    finished = []

    def slow() -> None:
        import time

        time.sleep(1)

    def interrupt(result: dict) -> None:  # Ctrl-C as the first model finishes
        finished.append(result)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        optimize_on_ray(collect(inputs, str(tmp_path / "out")), opts, on_result=interrupt, setup=slow)
    assert len(finished) == 1
    assert os.listdir(tmp_path / "out") == [os.path.basename(finished[0]["output"])]


def test_one_model_to_a_file_on_ray(cluster, tmp_path, cli, monkeypatch):
    """IN OUT with --ray, IN relative to this folder (a worker's folder is another)."""
    inputs = zoo(tmp_path, ["if_subgraph.onnx"])
    monkeypatch.chdir(tmp_path / "zoo")
    code, out, err = cli("optimize", "if_subgraph.onnx", str(tmp_path / "m.opt.onnx"), "--ray", "auto")
    assert code == 0, err
    assert out.startswith(f"if_subgraph.onnx -> {tmp_path / 'm.opt.onnx'}: ")
    assert "ran on " in out and "1 model(s): 1 written" in out and "with Ray (1 node(s))" in out
    serial = optimize_many(collect(inputs, str(tmp_path / "serial")), OptimizeOptions(measure=False), 1)
    assert serial[0]["error"] is None
    assert (tmp_path / "m.opt.onnx").read_bytes() == (tmp_path / "serial" / "if_subgraph.onnx").read_bytes()


def test_measuring_needs_a_timing_slot_on_some_node(cluster, tmp_path, cli, monkeypatch):
    inputs = zoo(tmp_path, ["if_subgraph.onnx"])
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    code, out, err = cli("optimize", inputs[0], str(tmp_path / "out"), "--ray", "auto", measure=True)
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        "onnxfuse: error: no node of the Ray cluster declares the onnxfuse_timing_slot resource, which measuring "
        "needs (one per node: measurements never share a node's cores) (hint: ray start ... "
        "--resources='{\"onnxfuse_timing_slot\": 1}' on each node, or --no-measure)"]
    assert not (tmp_path / "out").exists()


def test_a_node_killed_mid_run_is_retried_and_every_output_is_whole(cluster, tmp_path):
    """Last in this file: the cluster has one worker node afterwards."""
    inputs = zoo(tmp_path, ["cnn_small.onnx", "transformer_small.onnx", "if_subgraph.onnx", "transformer_op18.onnx"])
    opts = OptimizeOptions(measure=False)
    serial = optimize_many(collect(inputs, str(tmp_path / "serial")), opts, 1)
    assert all(d["error"] is None for d in serial)
    victim = cluster.workers[1]
    started = tmp_path / "started"
    started.mkdir()
    marks = str(started)
    killed = []

    def slow() -> None:  # each model says which node took it, then takes a few seconds
        import time

        open(os.path.join(marks, ray.get_runtime_context().get_node_id()), "a").close()
        time.sleep(2)

    def kill(counts: dict[str, int]) -> None:  # once the victim is running a model: its node dies
        if not killed and os.path.exists(started / victim.node_id):
            killed.append(dict(counts))
            cluster.remove_node(victim, allow_graceful=False)

    results = optimize_on_ray(collect(inputs, str(tmp_path / "ray")), opts, on_progress=kill, setup=slow)
    assert killed and killed[0]["done"] == 0
    assert [d["error"] for d in results] == [None] * len(inputs)
    assert victim.node_id not in {d["node"]["id"] for d in results}  # what it was running ran again elsewhere
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "serial")  # nothing partial, nothing missing
