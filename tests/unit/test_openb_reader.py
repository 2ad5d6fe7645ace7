"""The openb benchmark's node and pod list readers and command on files other than the shipped lists."""

from __future__ import annotations

import codecs

import pytest

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,32000,131072,1,T4\n"
POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time")
PODS = [
    "p0,4000,8192,1,1000,,LS,Running,0,1,0",
    "p1,2000,4096,1,500,T4,LS,Running,0,1,0",
    "p2,8000,8192,2,1000,P100,LS,Running,0,1,0",
    "p3,1000,1024,0,0,,BE,Running,0,1,0",
]


def _pod_list(tmp_path, text, name="x", *, encoding="utf-8", newline="\n"):
    path = tmp_path / f"openb_pod_list_{name}.csv"
    path.write_bytes(text.replace("\n", newline).encode(encoding))
    return path


def _expected():
    from benchmarks import openb

    return [openb.Pod("p0", 4000, 8192, 1, 1000, frozenset()), openb.Pod("p1", 2000, 4096, 1, 500, frozenset({"T4"})),
            openb.Pod("p2", 8000, 8192, 2, 1000, frozenset({"P100"})), openb.Pod("p3", 1000, 1024, 0, 0, frozenset())]


@pytest.mark.parametrize("variant", ["plain", "bom", "crlf", "blank lines and spaces"])
def test_a_pod_list_of_the_documented_format_reads_the_same_whatever_its_encoding_details(tmp_path, variant):
    from benchmarks import openb

    text = POD_HEADER + "\n" + "\n".join(PODS) + "\n"
    if variant == "bom":
        path = _pod_list(tmp_path, text, encoding="utf-8-sig")
    elif variant == "crlf":
        path = _pod_list(tmp_path, text, newline="\r\n")
    elif variant == "blank lines and spaces":
        path = _pod_list(tmp_path, "\n".join(f"{line.replace(',', ' , ')}  \n" for line in [POD_HEADER, *PODS]))
    else:
        path = _pod_list(tmp_path, text)
    assert openb.load_pods(path) == _expected()


def test_a_pod_list_with_other_columns_in_another_order_reads_the_same(tmp_path):
    from benchmarks import openb

    text = "gpu_spec,extra,gpu_milli,num_gpu,name,memory_mib,cpu_milli\n" \
           ",a,1000,1,p0,8192,4000\nT4,b,500,1,p1,4096,2000\nP100,c,1000,2,p2,8192,8000\n,d,0,0,p3,1024,1000\n"
    assert openb.load_pods(_pod_list(tmp_path, text)) == _expected()


def test_a_node_list_with_a_byte_order_mark_and_spaces_reads(tmp_path):
    from benchmarks import openb

    path = tmp_path / "nodes.csv"
    path.write_bytes(codecs.BOM_UTF8 + b"sn,cpu_milli,memory_mib,gpu,model \r\nn0,64000,262144,2,P100 \r\n\r\n")
    assert openb.load_nodes(path) == [openb.Node("n0", 64000, 262144, 2, "P100")]


@pytest.mark.parametrize(("row", "message"), [
    ("p0,4000,8192,one,1000", "line 3: num_gpu must be an integer, got 'one'"),
    ("p0,4000,8192", "line 3: expected 5 fields, got 3"),
    ("p0,4000,8192,-1,1000", "line 3: num_gpu must be >= 0, got -1"),
    ("p0,-5,8192,1,1000", "line 3: cpu_milli must be >= 0, got -5"),
    ("p0,4000,8192,1,1500", "line 3: gpu_milli must be in 1..1000 when num_gpu > 0, got 1500"),
    ("p0,4000,8192,2,500", "line 3: gpu_milli 500 is a share of one GPU, but num_gpu is 2"),
])
def test_a_malformed_pod_row_is_an_error_naming_the_file_line_and_field(tmp_path, row, message):
    from benchmarks import openb

    path = _pod_list(tmp_path, f"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np9,1,1,0,0\n{row}\n")
    with pytest.raises(openb.DataError) as raised:
        openb.load_pods(path)
    assert str(raised.value) == f"{path}: {message}"


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty file, expected a header naming name, cpu_milli, memory_mib, num_gpu, gpu_milli"),
    ("name,cpu_milli,num_gpu,gpu_milli\np0,1,1,1000\n", "line 1: missing column memory_mib"),
])
def test_a_pod_list_without_the_columns_is_an_error_naming_the_file(tmp_path, text, message):
    from benchmarks import openb

    path = _pod_list(tmp_path, text)
    with pytest.raises(openb.DataError) as raised:
        openb.load_pods(path)
    assert str(raised.value) == f"{path}: {message}"


def test_arrivals_of_a_pod_list_that_asks_for_no_gpu_are_an_error_not_an_endless_loop():
    from benchmarks import openb

    with pytest.raises(ValueError, match="no pod asks for a GPU"):
        openb.build_arrivals([openb.Pod("c", 1000, 1024, 0, 0, frozenset())], 2000, seed=1)
    with pytest.raises(ValueError, match="no pod asks for a GPU"):
        openb.build_arrivals([], 2000, seed=1)


@pytest.mark.parametrize(("pods", "message"), [
    (None, "openb_pod_list_x.csv: not found"),
    (POD_HEADER + "\n", "openb_pod_list_x.csv: no pod asks for a GPU"),
    (POD_HEADER + "\n" + PODS[3] + "\n", "openb_pod_list_x.csv: no pod asks for a GPU"),
    (POD_HEADER + "\np0,4000,8192,1,x,,LS,Running,0,1,0\n",
     "openb_pod_list_x.csv: line 2: gpu_milli must be an integer"),
    (b"name,cpu_milli,memory_mib,num_gpu,gpu_milli\n\xe9,1,1,1,1000\n", "openb_pod_list_x.csv: not UTF-8 text"),
])
def test_the_command_answers_a_bad_pod_list_with_an_error_not_a_traceback(tmp_path, capsys, pods, message):
    from benchmarks import openb

    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES)
    if isinstance(pods, bytes):
        (tmp_path / "openb_pod_list_x.csv").write_bytes(pods)
    elif pods is not None:
        _pod_list(tmp_path, pods)
    code = openb.main(["--data-dir", str(tmp_path), "--out-dir", str(tmp_path / "out"), "--pod-lists", "x",
                       "--seeds", "1", "--jobs", "1"])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_command_runs_a_small_pod_list_deterministically(tmp_path):
    import json

    from benchmarks import openb

    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES)
    _pod_list(tmp_path, POD_HEADER + "\n" + "\n".join(PODS) + "\n")
    runs = []
    for out in ("a", "b"):
        assert openb.main(["--data-dir", str(tmp_path), "--out-dir", str(tmp_path / out), "--pod-lists", "x",
                           "--seeds", "1-2", "--jobs", "1"]) == 0
        runs.append([{k: v for k, v in run.items() if k not in ("wall_s", "cpu_s")}
                     for run in json.loads((tmp_path / out / "openb.json").read_text())["runs"]])
    assert runs[0] == runs[1]


def test_a_run_reads_the_pod_list_of_its_own_data_directory(tmp_path):
    from benchmarks import openb

    results = []
    for name, gpus in (("one", 1), ("two", 2)):
        directory = tmp_path / name
        directory.mkdir()
        nodes = f"sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1000,{gpus},T4\n"
        (directory / "openb_node_list_gpu_node.csv").write_text(nodes)
        _pod_list(directory, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,0,0,1,1000\n", name="same")
        results.append(openb.run_one(str(directory), "same", "first-fit", 1))
    assert [r["pods"] for r in results] == [1, 2]  # 130% of 1 GPU: one 1-GPU pod; of 2 GPUs: two
