"""The durable file-system broker (controlplane.common.filesystem_broker): messages are published whole, a
message taken while its writer still writes is read once written, and an unreadable message is moved aside
instead of killing the worker (found by the C3 control-plane outage test: a worker died of a JSONDecodeError
reading a message file that kombu's producer had created but not yet written)."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import pytest
from kombu import Connection
from kombu.transport import filesystem
from kombu.utils.json import dumps

from controlplane.common import filesystem_broker


@pytest.fixture
def channel(tmp_path):
    filesystem_broker.register()
    queue_folder = tmp_path / "queue"
    queue_folder.mkdir()
    options = {"data_folder_in": str(queue_folder), "data_folder_out": str(queue_folder),
               "control_folder": str(tmp_path / "control")}
    with Connection("filesystem://", transport_options=options) as connection:
        chan = connection.default_channel
        assert isinstance(chan, filesystem_broker.DurableChannel)
        yield chan


def message(tag: str) -> dict:
    return {"body": tag, "properties": {"delivery_tag": tag}, "headers": {}}


def test_a_message_is_never_visible_before_it_is_written_whole(channel, monkeypatch):
    folder = channel.data_folder_out
    seen_while_writing = []
    real_fsync = os.fsync

    def spy_fsync(fd):
        seen_while_writing.append(sorted(os.listdir(folder)))
        real_fsync(fd)

    monkeypatch.setattr(filesystem_broker.os, "fsync", spy_fsync)
    channel._put("jobs", message("a"))
    assert seen_while_writing and all(not name.endswith(".msg") for name in seen_while_writing[0])
    assert [name for name in os.listdir(folder) if name.endswith(".jobs.msg")]
    assert not [name for name in os.listdir(folder) if name.startswith(filesystem_broker.INCOMING_PREFIX)]
    assert channel._get("jobs")["properties"]["delivery_tag"] == "a"


def test_a_message_taken_while_its_writer_still_writes_is_read_once_written(channel):
    """kombu's own producer creates the file, locks it and then writes: the consumer waits for the lock."""
    path = os.path.join(channel.data_folder_out, "1_x.jobs.msg")
    writer = open(path, "wb", buffering=0)  # noqa: SIM115 - held open across the consumer's read
    fcntl.flock(writer, fcntl.LOCK_EX)
    got: list = []
    consumer = threading.Thread(target=lambda: got.append(channel._get("jobs")))
    consumer.start()
    time.sleep(0.3)
    assert not got, "the consumer read a message its writer had not finished"
    writer.write(dumps(message("late")).encode())
    fcntl.flock(writer, fcntl.LOCK_UN)
    writer.close()
    consumer.join(timeout=5)
    assert got and got[0]["properties"]["delivery_tag"] == "late"


@pytest.mark.parametrize("content", [b"", b'{"body": "torn', b"[1, 2]"], ids=["empty", "torn", "not-a-message"])
def test_an_unreadable_message_is_moved_aside_and_the_next_one_delivered(channel, content, caplog):
    folder = channel.data_folder_in
    with open(os.path.join(folder, "0_dead.jobs.msg"), "wb") as dead:  # its writer died mid-write
        dead.write(content)
    channel._put("jobs", message("next"))
    assert channel._get("jobs")["properties"]["delivery_tag"] == "next"
    aside = os.path.join(folder, filesystem_broker.UNREADABLE_FOLDER)
    assert os.listdir(aside) == ["0_dead.jobs.msg"]
    assert "cannot be read" in caplog.text and "0_dead.jobs.msg" in caplog.text
    with pytest.raises(filesystem.Empty):
        channel._get("jobs")  # the unreadable one is not delivered later either


def test_an_acknowledged_message_is_gone_and_an_unacknowledged_one_comes_back(channel):
    channel._put("jobs", message("kept"))
    payload = channel._get("jobs")
    held = channel._in_hand["kept"]
    assert held.exists() and not [n for n in os.listdir(channel.data_folder_in) if n.endswith(".msg")]
    channel.qos.append(type("M", (), {"delivery_tag": "kept"})(), "kept")
    channel.qos.ack("kept")
    assert not held.exists()
    assert payload["body"] == "kept"
