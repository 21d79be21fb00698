"""``Facts``: the name-to-value records of a case (its environment, fingerprint, parameters),
read by attribute like the rest of the case record (``report.environment.python``, as
``report.result.median``) and by key like the JSON they come from and go to."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NoReturn


class Facts(dict[str, Any]):
    """A read-only dict whose keys read as attributes too; nested dicts are ``Facts`` as well.

    A dict, not just a ``Mapping``: ``json.dumps`` writes it as is (the results file, the
    baseline store), it compares equal to the plain dict with the same items (the store matches
    fingerprints that way), and ``**facts``, ``.get`` and ``isinstance(x, dict)`` keep working.
    Keys that are dict methods (``items``, ``keys``, ...) read by key only."""

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), /,
                 **more: Any) -> None:
        super().__init__(items, **more)
        for key, value in list(dict.items(self)):
            if isinstance(value, dict) and not isinstance(value, Facts):
                dict.__setitem__(self, key, Facts(value))

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no {name!r} here (known: {', '.join(sorted(self))})") from None

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *(k for k in self if k.isidentifier())})

    def __reduce__(self) -> tuple[Any, ...]:
        # copy, deepcopy and pickle rebuild it whole (the default would set items one by one).
        return (type(self), (dict(self),))

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("Facts are read-only: a case's record is what was measured; copy it "
                        "with dict(...) to change it")

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        self._read_only()
