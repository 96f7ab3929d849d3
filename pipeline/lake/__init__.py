"""The lake: the JVM-free Delta reader here; the Spark jobs run through ``sluice lake``.

Needs the ``[lake]`` (or ``[serve]``) extra: pyarrow and deltalake load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.facade import lazy

_EXPORTS = {
    "LakeReader": "pipeline.lake.storage.reader",
    "BlockRow": "pipeline.lake.storage.reader",
}

__all__ = [
    "BlockRow",
    "LakeReader",
]

__getattr__, __dir__ = lazy(__name__, _EXPORTS)

if TYPE_CHECKING:
    from pipeline.lake.storage.reader import (
        BlockRow as BlockRow,
    )
    from pipeline.lake.storage.reader import (
        LakeReader as LakeReader,
    )
