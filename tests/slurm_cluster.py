"""A real single-node SLURM cluster on this machine, for the tests (and by hand: see ``main``).

Debian's ``slurm-wlm`` and ``munge`` are installed when missing; ``slurm.conf`` is written into a
temp dir; ``munged`` (unless one already answers), ``slurmctld -D`` and ``slurmd -D`` are started
as child processes. Without systemd nothing starts by itself, and ``stop`` ends exactly the
processes ``start`` started, by PID. The cluster has no accounting storage (``sacct`` fails), as
many sites do, and keeps finished jobs visible to ``squeue``/``scontrol`` for ``MIN_JOB_AGE``.

By hand: ``python tests/slurm_cluster.py`` starts it, prints the ``SLURM_CONF`` to export, and
stops it on Ctrl-C.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
PARTITION = "compute"  # the partition profiles/*/config.yaml name in default-resources
MIN_JOB_AGE = 300  # >= 120 s: the slurm plugin trusts squeue only then (else it falls back to sacct)
MEMORY_FRACTION = 0.9
MUNGE_SOCKET_DIR = Path("/run/munge")
CONFIGLESS_LINK = Path("/run/slurm/conf")  # slurmd's link to the slurm.conf it fetched


class SlurmUnavailable(Exception):
    """This machine cannot run the cluster at all (not Debian, not root): a reason to skip."""


def unavailable_reason() -> str | None:
    if not sys.platform.startswith("linux") or not Path("/etc/debian_version").exists():
        return "needs Debian (slurm-wlm and munge are installed from its archive)"
    if shutil.which("apt-get") is None or shutil.which("dpkg-query") is None:
        return "needs apt-get and dpkg-query"
    if os.geteuid() != 0:
        return "needs root (to install slurm-wlm/munge, and to run slurmd and munged)"
    return None


def missing_packages() -> list[str]:
    missing = []
    for package in PACKAGES:
        status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
        if "install ok installed" not in status.stdout:
            missing.append(package)
    return missing


def install_packages() -> None:
    """apt-get install, with an `apt-get update` first only when the package lists are stale."""
    missing = missing_packages()
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
    if subprocess.run(install, capture_output=True, env=env).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True, env=env)
        result = subprocess.run(install, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise RuntimeError(f"apt-get install {' '.join(missing)} failed:\n{result.stdout}\n{result.stderr}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_line() -> str:
    """This machine as slurmd sees it (real hostname, CPUs, cores), with ~90% of its memory."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("NodeName="))
    memory = int(re.search(r"RealMemory=(\d+)", line).group(1))
    return re.sub(r"RealMemory=\d+", f"RealMemory={int(memory * MEMORY_FRACTION)}", line)


def slurm_conf(root: Path, node: str, ctld_port: int, slurmd_port: int) -> str:
    fields = dict(item.split("=", 1) for item in node.split())
    name, cpus, memory = fields["NodeName"], int(fields["CPUs"]), int(fields["RealMemory"])
    return f"""\
# A single-node cluster for betonbuild's tests (tests/slurm_cluster.py). No accounting storage.
ClusterName=betonbuild
SlurmctldHost={name}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={memory // cpus}
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.txt
MinJobAge={MIN_JOB_AGE}
MailProg=/bin/true
ReturnToService=2
MpiDefault=none
SlurmctldParameters=enable_configless
{node} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName={PARTITION} Nodes={name} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.processes: dict[str, subprocess.Popen] = {}
        self.node = ""
        self.ctld_port = 0

    def start(self, timeout: float = 60) -> None:
        install_packages()
        for sub in ("state", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.node = node_line()
        self.ctld_port = free_port()
        self.conf.write_text(slurm_conf(self.root, self.node, self.ctld_port, free_port()))
        self._start_munge()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        # Configless, as many sites run: slurmd fetches slurm.conf from slurmctld and links it at
        # /run/slurm/conf, where client commands inside jobs find it. (The slurm plugin's job step
        # removes SLURM_CONF from the environment of the srun it starts.)
        without_conf = {k: v for k, v in self.env.items() if k != "SLURM_CONF"}
        self._spawn("slurmd", ["slurmd", "-D", "--conf-server", f"127.0.0.1:{self.ctld_port}"], env=without_conf)
        self._wait_until_idle(timeout)

    def _spawn(self, name: str, cmd: list[str], env: dict | None = None, **kwargs) -> None:
        log = open(self.root / f"{name}.out", "w")
        self.processes[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env or self.env, **kwargs
        )
        log.close()

    def _munge_answers(self) -> bool:
        try:
            credential = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
            if credential.returncode != 0:
                return False
            return subprocess.run(["unmunge"], input=credential.stdout, capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _start_munge(self) -> None:
        if self._munge_answers():
            return  # the machine's own munged: use it, and leave it running
        munge = pwd.getpwnam("munge")
        MUNGE_SOCKET_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chown(MUNGE_SOCKET_DIR, munge.pw_uid, munge.pw_gid)
        self._spawn(
            "munged", ["munged", "--foreground", "--force"], user=munge.pw_uid, group=munge.pw_gid, extra_groups=[]
        )
        self._wait(self._munge_answers, 15, "munged to answer")

    def _wait_until_idle(self, timeout: float) -> None:
        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=self.env)
            return out.returncode == 0 and out.stdout.split() == ["idle"]

        self._wait(idle, timeout, "sinfo to show the node idle")

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [name for name, proc in self.processes.items() if proc.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}:\n{self.logs()}")

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        """A SLURM client command against this cluster."""
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, check=check, timeout=60)

    def jobcomp(self) -> list[dict[str, str]]:
        """The finished jobs (jobcomp/filetxt): one dict of KEY=value fields per job."""
        path = self.root / "jobcomp.txt"
        if not path.exists():
            return []
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in path.read_text().splitlines() if line.strip()]

    def logs(self, lines: int = 30) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out", "munged.out"):
            path = self.root / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path}\n" + "\n".join(tail))
        return "\n".join(out)

    def stop(self) -> None:
        """Cancels this cluster's jobs, then ends the daemons this object started, by PID."""
        if "slurmctld" in self.processes and self.processes["slurmctld"].poll() is None:
            self.run("scancel", "--user", pwd.getpwuid(os.geteuid()).pw_name, check=False)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                out = self.run("squeue", "-h", "-t", "RUNNING,COMPLETING,PENDING,CONFIGURING", check=False)
                if out.returncode != 0 or not out.stdout.strip():
                    break
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.processes.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=15)
        if CONFIGLESS_LINK.is_symlink() and str(self.root) in os.readlink(CONFIGLESS_LINK):
            CONFIGLESS_LINK.unlink()


def main() -> None:
    reason = unavailable_reason()
    if reason:
        sys.exit(f"cannot start SLURM here: {reason}")
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/betonbuild-slurm")
    cluster = SlurmCluster(root)
    try:
        cluster.start()
        print(f"SLURM is up ({cluster.node.split()[0]}). In another shell:\n  export SLURM_CONF={cluster.conf}")
        print("Ctrl-C stops it.", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
