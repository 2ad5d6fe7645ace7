"""The embedded profile's file-system broker, made at-least-once: kombu's file-system transport deletes a
message file as soon as a worker reads it, so a worker killed with a message in hand (acks_late or not)
lost that message for good.

Here a worker moves the file it takes into its own in-hand folder (`in_hand_folder` transport option,
default `<queue folder>/.in_hand`) and deletes it only when the message is acknowledged; a rejected or
restored message goes back to the queue first. Each consumer holds an exclusive lock on its in-hand
folder while it lives; the kernel drops the lock when the process dies, however it dies. Consumers look
for in-hand folders whose lock they can take (their owner is gone) when they start and every few
seconds, and put those messages back at the front of the queue.

Also: kombu creates an exchange's binding table file, then writes it; a worker killed in between left an
empty file that made every later worker fail at start (JSONDecodeError in _queue_bind). An empty or
unreadable table is read here as no bindings, and rewritten.

And messages are published whole: kombu creates `<name>.msg` in the queue folder and then writes it (under a
lock that only its own reader takes), so a consumer here could take a file whose writer had not written it
yet and read it empty: the worker died of a JSONDecodeError (found by the C3 control-plane outage test), and
a producer killed between create and write left an empty message that would kill every worker. A message
is now written to a hidden `.incoming-*` file and renamed into place (atomic on one file system); a taken
file is read under the writer's lock (an older writer's file is read once it is written); and a message
that still cannot be read (its writer died mid-write) is moved aside to `<queue folder>/.unreadable/`
with the reason logged, never delivered and never fatal.

`register()` makes `filesystem://` URLs use this transport in this process (settings.py calls it).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import uuid
from pathlib import Path
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

ORPHAN_SCAN_SECONDS = 5.0
LOCK_NAME = ".owner.lock"
INCOMING_PREFIX = ".incoming-"  # a message being written; never matches a queue's `.msg` suffix
UNREADABLE_FOLDER = ".unreadable"

log = logging.getLogger(__name__)


class DurableQoS(virtual.QoS):
    def ack(self, delivery_tag):
        super().ack(delivery_tag)
        self.channel._release_in_hand(delivery_tag)

    def reject(self, delivery_tag, requeue=False):
        super().reject(delivery_tag, requeue=requeue)  # a requeue goes through Channel._restore first
        self.channel._release_in_hand(delivery_tag)


class DurableChannel(filesystem.Channel):
    QoS = DurableQoS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._in_hand: dict[str, Path] = {}  # delivery tag -> the message file this consumer holds
        self._no_ack_queues: set[str] = set()  # queues read without acks (broadcast, replies): nothing to hold
        self._owner_folder: Path | None = None
        self._owner_lock = None
        self._owner_pid = 0
        self._last_orphan_scan = float("-inf")

    @property
    def in_hand_folder(self) -> Path:
        folder = self.transport_options.get("in_hand_folder")
        return Path(folder) if folder else Path(self.data_folder_in) / ".in_hand"

    def basic_consume(self, queue, no_ack, *args, **kwargs):
        if no_ack:
            self._no_ack_queues.add(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_get(self, queue, no_ack=False, **kwargs):
        if no_ack:
            self._no_ack_queues.add(queue)
        return super().basic_get(queue, no_ack=no_ack, **kwargs)

    def _claim_owner_folder(self) -> Path:
        if self._owner_folder is None:
            folder = self.in_hand_folder / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            folder.mkdir(parents=True)
            lock = open(folder / LOCK_NAME, "wb")  # noqa: SIM115 - held for the channel's lifetime
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._owner_folder, self._owner_lock, self._owner_pid = folder, lock, os.getpid()
        return self._owner_folder

    def restore_orphans(self) -> int:
        """Put back the messages of consumers that died holding them; returns how many."""
        self._last_orphan_scan = monotonic()
        restored = 0
        try:
            owners = list(self.in_hand_folder.iterdir())
        except FileNotFoundError:
            return 0
        for owner in owners:
            if owner == self._owner_folder or not owner.is_dir():
                continue
            try:
                lock = open(owner / LOCK_NAME, "ab")  # noqa: SIM115
            except OSError:
                continue
            with lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # its owner is alive
                for message in owner.glob("*.msg"):
                    with contextlib.suppress(OSError):
                        os.rename(message, Path(self.data_folder_in) / message.name)  # the name keeps its place
                        restored += 1
                with contextlib.suppress(OSError):
                    (owner / LOCK_NAME).unlink()
                    owner.rmdir()
        return restored

    def get_table(self, exchange):
        try:
            return super().get_table(exchange)
        except ValueError:  # an empty or torn table file: its writer died
            return []

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        try:
            with open(file, "ab+", buffering=0) as table:  # created if missing, never truncated before the lock
                fcntl.flock(table, fcntl.LOCK_EX)
                table.seek(0)
                try:
                    bindings = [filesystem.exchange_queue_t(*row) for row in loads(bytes_to_str(table.read()))]
                except ValueError:
                    bindings = []
                if binding not in bindings:
                    bindings.insert(0, binding)
                    table.truncate(0)
                    table.write(str_to_bytes(dumps(bindings)))  # appended: the file was just emptied
                    os.fsync(table.fileno())
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc

    def _get(self, queue):
        """Take the oldest message of `queue` into this consumer's in-hand folder (kept until the ack)."""
        if queue in self._no_ack_queues:
            return super()._get(queue)
        if monotonic() - self._last_orphan_scan > ORPHAN_SCAN_SECONDS:
            self.restore_orphans()
        wanted = f"{queue}.msg"
        for filename in sorted(os.listdir(self.data_folder_in)):
            if filename.partition(".")[2] != wanted:
                continue
            held = self._claim_owner_folder() / filename
            try:
                os.rename(os.path.join(self.data_folder_in, filename), held)
            except OSError:
                continue  # another consumer took it first
            payload = self._read_held(held)
            if payload is None:
                continue
            self._in_hand[payload["properties"]["delivery_tag"]] = held
            return payload
        raise filesystem.Empty()

    def _put(self, queue, payload, **kwargs):
        """Publish `payload` whole: written and synced under a hidden name, then renamed to `<name>.msg`."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"  # kombu's name: its order
        folder = self.data_folder_out
        incoming = os.path.join(folder, f"{INCOMING_PREFIX}{uuid.uuid4().hex}")
        try:
            with open(incoming, "wb", buffering=0) as message:
                message.write(str_to_bytes(dumps(payload)))
                os.fsync(message.fileno())
            os.rename(incoming, os.path.join(folder, name))
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(incoming)
            raise ChannelError(f"Cannot add file {name!r} to directory {folder!r}") from exc

    def _read_held(self, held: Path) -> dict | None:
        """The message in a file just taken, read under its writer's lock; None (and moved aside) if unreadable."""
        try:
            with open(held, "rb") as message:
                fcntl.flock(message, fcntl.LOCK_SH)  # a writer that locks (kombu's own _put) has finished
                payload = loads(bytes_to_str(message.read()))
            payload["properties"]["delivery_tag"]  # noqa: B018 - a message without one is not a message
            return payload
        except (OSError, ValueError, KeyError, TypeError) as exc:
            aside = Path(self.data_folder_in) / UNREADABLE_FOLDER
            with contextlib.suppress(OSError):
                aside.mkdir(exist_ok=True)
                os.rename(held, aside / held.name)
            log.error("file-system broker: message %s cannot be read (%s: %s); moved to %s, not delivered",
                      held.name, type(exc).__name__, exc, aside)
            return None

    def _restore(self, message):
        super()._restore(message)  # back in the queue first, then let go of the held copy
        self._release_in_hand(message.delivery_tag)

    def _release_in_hand(self, delivery_tag) -> None:
        held = self._in_hand.pop(delivery_tag, None)
        if held is not None:
            with contextlib.suppress(FileNotFoundError):
                held.unlink()

    def close(self):
        super().close()  # restores unacknowledged messages
        if self._owner_lock is not None and self._owner_pid == os.getpid():  # not in a forked pool child
            with contextlib.suppress(OSError):
                (self._owner_folder / LOCK_NAME).unlink()
                self._owner_folder.rmdir()
            self._owner_lock.close()
            self._owner_lock = None


class DurableTransport(filesystem.Transport):
    Channel = DurableChannel


def register() -> None:
    """Make `filesystem://` mean the durable transport in this process."""
    TRANSPORT_ALIASES["filesystem"] = f"{__name__}:DurableTransport"
    from kombu.transport import _transport_cache

    _transport_cache.pop("filesystem", None)
