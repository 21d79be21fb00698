"""The history store (``--dlperf-history URL``): every run appends each case's samples (every
window of every metric, by launch), its fingerprint, where its step's time went (its phases), and
the run's commit, branch, date and host.

One code path for two databases, through SQLAlchemy Core:

- a path (``.dlperf/history.db``) or ``sqlite:///...``: an SQLite file, the embedded default.
  Writers take the database's write lock when their transaction begins (``BEGIN IMMEDIATE``) and
  wait for it up to ``BUSY_TIMEOUT_S``: two runners finishing at once both land, one after the
  other, and neither can fail half-way through upgrading a read lock.
- ``postgresql://...``: a shared PostgreSQL server for fleets of runners (through psycopg 3).
  Creating or upgrading the schema holds a transaction-scoped advisory lock, so two runners
  meeting a new server do not both create it.

The schema carries its version (``dlperf_meta``); an older store is upgraded in place by
``MIGRATIONS`` (one function per step, in one transaction with the version's update), a newer
one is refused: what this version would write could lose what that one keeps. A file that is not
an SQLite database, or a database whose ``dlperf_`` tables lack the version, is refused too, and
never written to: the message names it and says what to do.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .history_rows import ACCEPTING as ACCEPTING
from .history_rows import Point as Point

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

SCHEMA_VERSION = 4
BUSY_TIMEOUT_S = 60.0
# The store's version; the tables it owns all start with the prefix, so a shared database's own
# tables are never touched.
PREFIX = "dlperf_"
_LOCK_KEY = 0x646C70657266  # "dlperf": PostgreSQL's advisory lock for schema changes


class HistoryError(Exception):
    """The history store cannot be used; the message names it and the problem."""


def _v1_to_v2(conn: Connection) -> None:
    """Schema 2: each case row says what the run did to its baseline (NULL in older rows: they
    did not say, so they accept no step)."""
    conn.exec_driver_sql(f"ALTER TABLE {PREFIX}cases ADD COLUMN baseline_action VARCHAR(32)")


def _v2_to_v3(conn: Connection) -> None:
    """Schema 3: each case row keeps what its launches ran beside (NULL in older rows: not
    measured)."""
    conn.exec_driver_sql(f"ALTER TABLE {PREFIX}cases ADD COLUMN interference TEXT")


def _v3_to_v4(conn: Connection) -> None:
    """Schema 4: each case row keeps where its step's time went (``Phases.to_json``; NULL in
    older rows: no diagnostic steps ran)."""
    conn.exec_driver_sql(f"ALTER TABLE {PREFIX}cases ADD COLUMN phases TEXT")


# step -> the function that takes a store at schema ``step`` to ``step + 1`` (in the
# transaction that records the new version).
MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3,
                                                       3: _v3_to_v4}


def _sqlalchemy() -> Any:
    try:
        import sqlalchemy
    except ImportError:
        raise HistoryError("--dlperf-history needs SQLAlchemy: pip install "
                           "'pytest-dlperf[history]' (SQLAlchemy, and psycopg for PostgreSQL)"
                           ) from None
    return sqlalchemy


def _tables(sa: Any) -> tuple[Any, ...]:
    """The schema at ``SCHEMA_VERSION``, on a fresh MetaData."""
    meta = sa.MetaData()
    store_meta = sa.Table(f"{PREFIX}meta", meta,
                          sa.Column("key", sa.String(64), primary_key=True),
                          sa.Column("value", sa.Text, nullable=False))
    runs = sa.Table(
        f"{PREFIX}runs", meta,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, index=True),
        sa.Column("commit_id", sa.String(64)),
        sa.Column("branch", sa.String(255)),
        sa.Column("dirty", sa.Boolean),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("machine", sa.String(255), nullable=False),
        sa.Column("plugin_version", sa.String(64), nullable=False),
        sa.Column("protocol", sa.Text, nullable=False))  # JSON
    cases = sa.Table(
        f"{PREFIX}cases", meta,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey(f"{PREFIX}runs.id"), nullable=False,
                  index=True),
        sa.Column("case_key", sa.String(1024), nullable=False),
        sa.Column("fingerprint_id", sa.String(255), nullable=False),
        sa.Column("fingerprint", sa.Text, nullable=False),  # JSON
        sa.Column("framework", sa.String(64), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("unit", sa.String(64), nullable=False),
        sa.Column("verdict", sa.String(64)),
        # What the run did to the case's baseline (baselines.Change.action), if anything: a
        # step in the history is accepted once a run from it on recorded the baseline.
        sa.Column("baseline_action", sa.String(32)),
        # What each launch ran beside (JSON, one per launch; Interference.to_json).
        sa.Column("interference", sa.Text),
        # Seconds per step of each phase of its diagnostic steps (JSON; Phases.to_json).
        sa.Column("phases", sa.Text),
        sa.Index(f"{PREFIX}cases_series", "case_key", "fingerprint_id"))
    samples = sa.Table(
        f"{PREFIX}samples", meta,
        sa.Column("case_id", sa.Integer, sa.ForeignKey(f"{PREFIX}cases.id"), nullable=False,
                  index=True),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("launch", sa.Integer, nullable=False),
        sa.Column("window", sa.Integer, nullable=False),
        sa.Column("value", sa.Float, nullable=False))
    return meta, store_meta, runs, cases, samples


def engine_url(raw: str, base: Path | None = None) -> str:
    """An SQLAlchemy URL from what the user gave: a path (relative to ``base``) is an SQLite
    file; ``postgresql://`` gets psycopg 3 unless a driver is named."""
    text = str(raw).strip()
    if not text:
        raise HistoryError("an empty --dlperf-history: give a path (.dlperf/history.db) or a "
                           "postgresql:// URL")
    if "://" not in text:
        path = Path(text).expanduser()
        if not path.is_absolute():
            path = (base or Path.cwd()) / path
        return f"sqlite:///{path}"
    scheme = text.split("://", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        return "postgresql+psycopg://" + text.split("://", 1)[1]
    if scheme.startswith(("postgresql+", "sqlite")):
        return text
    raise HistoryError(f"--dlperf-history {text!r}: expected a path (an SQLite file) or a "
                       f"postgresql:// URL, not a {scheme}:// one")


class History:
    """An open history store. ``History.open(url)`` checks (and creates or upgrades) the
    schema before anything is written."""

    def __init__(self, engine: Engine, shown: str) -> None:
        self.engine, self.shown = engine, shown
        self._sa = _sqlalchemy()
        self._meta, self._store_meta, self._runs, self._cases, self._samples = _tables(self._sa)

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, raw: str, base: Path | None = None, create: bool = True) -> History:
        """``create=False`` (a reader: the report) refuses a store that does not exist yet
        instead of creating it."""
        sa = _sqlalchemy()
        url = engine_url(raw, base)
        parsed = sa.engine.make_url(url)
        shown = parsed.render_as_string(hide_password=True)
        if parsed.get_backend_name() == "sqlite":
            shown = parsed.database or shown
            if not create and not (parsed.database and Path(parsed.database).is_file()):
                raise HistoryError(f"{shown}: no such file; give the path or URL that "
                                   "--dlperf-history wrote to")
            engine = cls._sqlite_engine(sa, url, parsed.database)
        else:
            try:
                engine = sa.create_engine(url, pool_pre_ping=True)
            except ImportError as exc:
                raise HistoryError(f"{shown}: the PostgreSQL driver is missing ({exc}): pip "
                                   "install 'pytest-dlperf[history]'") from None
        history = cls(engine, shown)
        try:
            history._prepare(create)
        finally:
            # No connection kept open through hours of training: a server may drop idle
            # ones, and the write at the end opens its own.
            engine.dispose()
        return history

    @staticmethod
    def _sqlite_engine(sa: Any, url: str, database: str | None) -> Engine:
        if database:
            folder = Path(database).parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise HistoryError(f"{database}: cannot create its folder: {exc}") from None
        engine: Engine = sa.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})

        def no_implicit_transactions(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # the "begin" hook below opens them

        def write_lock_first(connection: Any) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        sa.event.listen(engine, "connect", no_implicit_transactions)
        sa.event.listen(engine, "begin", write_lock_first)
        return engine

    def _prepare(self, create: bool = True) -> None:
        """Create the schema in an empty store, upgrade an older one; refuse what is not one
        of ours or is newer."""
        sa = self._sa
        try:
            with self.engine.begin() as conn:
                if self.engine.dialect.name == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
                names = set(sa.inspect(conn).get_table_names())
                ours = {n for n in names if n.startswith(PREFIX)}
                if not ours and not create:
                    raise HistoryError(f"{self.shown} holds no pytest-dlperf history (no "
                                       f"{PREFIX} tables); give the store --dlperf-history "
                                       "wrote to")
                if not ours:
                    self._meta.create_all(conn)
                    conn.execute(self._store_meta.insert(),
                                 [{"key": "schema_version", "value": str(SCHEMA_VERSION)}])
                    return
                if self._store_meta.name not in ours:
                    raise HistoryError(
                        f"{self.shown} has pytest-dlperf's tables ({', '.join(sorted(ours))}) "
                        f"but no {self._store_meta.name} table with their schema version: not "
                        "a store this version can trust. It is left as it is; name another "
                        "with --dlperf-history")
                row = conn.execute(sa.select(self._store_meta.c.value).where(
                    self._store_meta.c.key == "schema_version")).first()
                try:
                    version = int(row[0]) if row else -1
                except ValueError:
                    version = -1
                if version < 1:
                    raise HistoryError(f"{self.shown}: its schema version is missing or "
                                       f"unreadable ({row[0] if row else 'no row'!r}); it is "
                                       "left as it is")
                if version > SCHEMA_VERSION:
                    raise HistoryError(
                        f"{self.shown} has schema version {version}, newer than this "
                        f"pytest-dlperf's {SCHEMA_VERSION}: a newer pytest-dlperf wrote it. It "
                        "is left as it is; upgrade pytest-dlperf to write to it")
                for step in range(version, SCHEMA_VERSION):
                    MIGRATIONS[step](conn)
                if version < SCHEMA_VERSION:
                    conn.execute(self._store_meta.update().where(
                        self._store_meta.c.key == "schema_version").values(
                            value=str(SCHEMA_VERSION)))
        except HistoryError:
            raise
        except sa.exc.DBAPIError as exc:
            raise HistoryError(self._problem(exc)) from None

    def _problem(self, exc: Exception) -> str:
        text = str(getattr(exc, "orig", exc)).strip().splitlines()[0] if str(exc) else repr(exc)
        if self.engine.dialect.name == "sqlite" and "not a database" in text:
            return (f"{self.shown} is not an SQLite database ({text}): not a history store. "
                    "It is left as it is; move it away or name another with --dlperf-history")
        return f"{self.shown}: {text}"

    # -- writing ------------------------------------------------------------------------

    def append(self, run: dict[str, Any], cases: list[dict[str, Any]]) -> int:
        """One run and its cases in one transaction; the run's id. ``run``: started_at
        (aware datetime), commit_id, branch, dirty, host, machine, plugin_version, protocol
        (dict). Each case: case_key, fingerprint (dict), fingerprint_id, framework, model,
        unit, verdict, baseline_action, interference (one dict per launch), phases
        (``Phases.to_json``) (the last three optional), metrics ({name: launches of windows})."""
        sa = self._sa
        try:
            with self.engine.begin() as conn:
                inserted = conn.execute(self._runs.insert().values(
                    **{**run, "protocol": json.dumps(run["protocol"], sort_keys=True)})
                ).inserted_primary_key
                assert inserted is not None
                run_id = inserted[0]
                for case in cases:
                    key = conn.execute(self._cases.insert().values(
                        run_id=run_id, case_key=case["case_key"],
                        fingerprint_id=case["fingerprint_id"],
                        fingerprint=json.dumps(case["fingerprint"], sort_keys=True),
                        framework=case["framework"], model=case["model"], unit=case["unit"],
                        verdict=case.get("verdict"),
                        baseline_action=case.get("baseline_action"),
                        interference=_json_or_none(case.get("interference")),
                        phases=_json_or_none(case.get("phases")))).inserted_primary_key
                    assert key is not None
                    case_id = key[0]
                    rows = [{"case_id": case_id, "metric": metric, "launch": li, "window": wi,
                             "value": float(value)}
                            for metric, launches in case["metrics"].items()
                            for li, launch in enumerate(launches)
                            for wi, value in enumerate(launch)]
                    if rows:
                        conn.execute(self._samples.insert(), rows)
                return int(run_id)
        except sa.exc.DBAPIError as exc:
            raise HistoryError(self._problem(exc)) from None

    # -- reading ------------------------------------------------------------------------

    def series(self, case_key: str, fingerprint_id: str,
               metric: str = "samples_per_s") -> list[Point]:
        """Every run of one case and fingerprint, oldest first, with that metric's samples."""
        sa = self._sa
        runs, cases, samples = self._runs, self._cases, self._samples
        query = (sa.select(runs.c.id, runs.c.started_at, runs.c.commit_id, runs.c.branch,
                           runs.c.host, cases.c.verdict, cases.c.baseline_action,
                           cases.c.phases, samples.c.launch, samples.c.window,
                           samples.c.value)
                 .join(cases, cases.c.run_id == runs.c.id)
                 .join(samples, samples.c.case_id == cases.c.id)
                 .where(cases.c.case_key == case_key, cases.c.fingerprint_id == fingerprint_id,
                        samples.c.metric == metric)
                 .order_by(runs.c.started_at, runs.c.id, samples.c.launch, samples.c.window))
        points: dict[int, Point] = {}
        try:
            with self.engine.connect() as conn:
                rows = list(conn.execute(query))
        except sa.exc.DBAPIError as exc:
            raise HistoryError(self._problem(exc)) from None
        for row in rows:
            point = points.get(row.id)
            if point is None:
                point = points[row.id] = Point(row.id, _aware(row.started_at), row.commit_id,
                                               row.branch, row.host, row.verdict,
                                               baseline_action=row.baseline_action,
                                               phases=_phases(row.phases))
            while len(point.launches) <= row.launch:
                point.launches.append([])
            point.launches[row.launch].append(float(row.value))
        return list(points.values())

    def keys(self) -> list[dict[str, Any]]:
        """Every (case, fingerprint) the store has, with its framework, model, unit, the
        fingerprint itself and how many runs."""
        sa = self._sa
        cases = self._cases
        query = (sa.select(cases.c.case_key, cases.c.fingerprint_id,
                           sa.func.count(cases.c.id).label("runs"),
                           sa.func.max(cases.c.fingerprint).label("fingerprint"),
                           sa.func.max(cases.c.framework).label("framework"),
                           sa.func.max(cases.c.model).label("model"),
                           sa.func.max(cases.c.unit).label("unit"))
                 .group_by(cases.c.case_key, cases.c.fingerprint_id)
                 .order_by(cases.c.case_key, cases.c.fingerprint_id))
        try:
            with self.engine.connect() as conn:
                rows = list(conn.execute(query))
        except sa.exc.DBAPIError as exc:
            raise HistoryError(self._problem(exc)) from None
        return [{"case_key": r.case_key, "fingerprint_id": r.fingerprint_id,
                 "runs": int(r.runs), "fingerprint": json.loads(r.fingerprint),
                 "framework": r.framework, "model": r.model, "unit": r.unit} for r in rows]

    def schema_version(self) -> int:
        sa = self._sa
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(self._store_meta.c.value).where(
                self._store_meta.c.key == "schema_version")).first()
        if row is None:
            raise HistoryError(f"{self.shown}: its schema version is gone")
        return int(row[0])

    def close(self) -> None:
        self.engine.dispose()


def _aware(value: dt.datetime) -> dt.datetime:
    """SQLite hands datetimes back naive; they were written in UTC."""
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


def _phases(text: str | None) -> dict[str, Any] | None:
    loaded: dict[str, Any] | None = json.loads(text) if text else None
    return loaded
