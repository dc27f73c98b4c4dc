"""A throwaway PostgreSQL server for tests: Debian's ``initdb`` and ``pg_ctl``, a Unix socket in a
private temporary folder, no TCP listener (``tests/test_postgres_gradebook.py``, ``tests/test_cluster.py``)."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

PORT = 5432  # names the socket file only: the server has no TCP listener
DEBIAN_SERVERS = Path("/usr/lib/postgresql")  # <version>/bin/{initdb,pg_ctl,...}


def _server_bindir() -> Path:
    """The newest installed server's binaries (Debian keeps them off PATH)."""
    found = sorted(
        DEBIAN_SERVERS.glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0
    )
    if found:
        return found[-1].parent
    if shutil.which("initdb") and shutil.which("pg_ctl"):
        return Path(shutil.which("pg_ctl")).parent
    pytest.fail(
        "the PostgreSQL server (initdb, pg_ctl) is needed: run scripts/system_deps.sh "
        "(apt-get install postgresql)"
    )


class PostgresServer:
    """A PostgreSQL cluster in ``folder``, listening on a Unix socket there and nowhere else.

    The server refuses to run as root: as root, ``initdb`` and ``pg_ctl`` run as the
    ``postgres`` system user (created by the Debian package), which owns ``folder``.
    Connections on the socket are trusted: nothing but its owner (and root) can reach it.
    """

    def __init__(self, bindir: Path, folder: Path):
        self.bindir, self.folder, self.data = bindir, folder, folder / "data"
        self.log = folder / "server.log"
        self.as_postgres = os.geteuid() == 0
        self.superuser = "postgres" if self.as_postgres else getpass.getuser()
        if self.as_postgres:
            try:
                shutil.chown(folder, "postgres", "postgres")
            except LookupError:
                pytest.fail(
                    "running as root, PostgreSQL needs the `postgres` system user: run scripts/system_deps.sh"
                )
        folder.chmod(0o700)

    def run(self, tool: str, *args: str) -> str:
        command = [str(self.bindir / tool), *args]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.is_file() else ""
            raise RuntimeError(f"{tool} failed ({done.returncode}):\n{done.stdout}{done.stderr}{log}")
        return done.stdout

    def start(self) -> None:
        self.run(
            "initdb",
            "-D",
            str(self.data),
            "--auth=trust",
            f"--username={self.superuser}",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        options = (
            f"-c listen_addresses='' -c unix_socket_directories='{self.folder}' -c port={PORT} -c fsync=off"
        )
        self.run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start"
        )

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def client(self, tool: str, *args: str) -> str:
        return self.run(tool, "-h", str(self.folder), "-p", str(PORT), "-U", self.superuser, *args)

    def create_database(self, name: str) -> str:
        """A new database owned by the role ``grader`` (as the README creates it); its URL."""
        if (
            "grader"
            not in self.client("psql", "-d", "postgres", "-Atc", "SELECT rolname FROM pg_roles").split()
        ):
            self.client("createuser", "grader")
        self.client("createdb", "--owner=grader", name)
        return f"postgresql://grader@/{name}?host={self.folder}&port={PORT}"

    def sql(self, url: str, query: str, *params) -> list[tuple]:
        """``query`` through the driver itself, bypassing nbgrader and SQLAlchemy."""
        import psycopg
        from sqlalchemy import make_url

        u = make_url(url)
        with psycopg.connect(host=str(self.folder), port=PORT, dbname=u.database, user=u.username) as conn:
            return conn.execute(query, params).fetchall()


@contextlib.contextmanager
def postgres_server():
    """A running :class:`PostgresServer`, stopped and deleted afterwards."""
    bindir = _server_bindir()
    try:
        import psycopg  # noqa: F401 (the driver SQLAlchemy uses for postgresql:// URLs)
    except ImportError:
        pytest.fail("the PostgreSQL driver is missing: pip install -r requirements.txt")
    # not under pytest's tmp_path: the `postgres` user cannot enter root's private folders,
    # and a socket path must stay short (about 100 characters)
    folder = Path(tempfile.mkdtemp(prefix="coursekit-pg-"))
    pg = None
    try:
        pg = PostgresServer(bindir, folder)
        pg.start()
        yield pg
    finally:
        try:
            if pg is not None:
                pg.stop()
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def postgres_course(parent: Path, url: str, name: str = "course") -> tuple[Path, Path]:
    """A throwaway course folder whose nbgrader_config.py puts the gradebook at ``url``."""
    from tests.submissions import course_folder

    root, inbox = course_folder(parent, name)
    with open(root / "nbgrader_config.py", "a") as f:
        f.write(f"\nc.CourseDirectory.db_url = {url!r}\n")
    return root, inbox
