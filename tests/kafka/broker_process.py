"""One throwaway Kafka broker process (tests/kafka/broker.sh) in its own directory: the part the
integration tests (tests/integration/kafka_fixtures.py) and the fuzzer (tests/fuzz/harness.py)
share. Each adds its own topics and clients."""
from __future__ import annotations

import subprocess
from pathlib import Path

BROKER_SH = Path(__file__).resolve().parent / "broker.sh"


class BrokerProcess:
    """start() blocks until the broker serves and sets bootstrap (127.0.0.1:port)."""

    def __init__(self, directory: Path, extra_properties=()):
        self.dir = directory
        self.extra = list(extra_properties)  # server.properties lines (k=v)
        self.bootstrap = None

    def run(self, *args, timeout=300) -> str:
        """broker.sh with args; its last line of output. Raises with its stderr on failure."""
        proc = subprocess.run([str(BROKER_SH), *args], capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"broker.sh {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""

    def start(self):
        self.bootstrap = self.run("start", str(self.dir), "", *self.extra)
        return self

    def kill(self):
        """SIGKILL, like a crash."""
        self.run("kill", str(self.dir))

    def restart(self):
        """Starts again on the same port with the same data (after kill() or stop())."""
        self.run("restart", str(self.dir))

    def stop(self):
        self.run("stop", str(self.dir))

    def pid(self) -> int:
        return int((self.dir / "pid").read_text())

    def set_producer_quota(self, client_id: str, bytes_per_second: int):
        """A client quota on produce throughput (producer_byte_rate) for one client.id: the broker
        delays its answers so that the client produces no faster, as a shared cluster does."""
        self.run("run-class", "kafka.admin.ConfigCommand", "--bootstrap-server", self.bootstrap, "--alter",
                 "--entity-type", "clients", "--entity-name", client_id,
                 "--add-config", f"producer_byte_rate={bytes_per_second}", timeout=120)
