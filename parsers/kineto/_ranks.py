"""What a Kineto trace's header says about its rank: ``distributedInfo``, else the file name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from traceview.parsers._files import rank_from_file_name
from traceview.parsers._result import RankInfo
from traceview.parsers.kineto._events import as_int


#: The largest rank (ranks are int32 in the store): a rank or world size beyond it, a
#: negative rank, or a rank not below its world size is not believed (docs/formats.md).
MAX_RANK = (1 << 31) - 1


def rank_info(path: Path, header: dict[str, Any], base_ns: int,
               warnings: list[str]) -> RankInfo:
    info = header.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    devices = header.get("deviceProperties")
    names = [d.get("name", "") for d in devices if isinstance(d, dict)] if isinstance(
        devices, list) else []
    rank, world = as_int(info.get("rank")), as_int(info.get("world_size"))
    if world is not None and not 1 <= world <= MAX_RANK + 1:
        warnings.append(f"distributedInfo world_size {world} is out of bounds (1 to 2^31): "
                        "left out")
        world = None
    if rank is not None and (not 0 <= rank <= MAX_RANK or (world is not None and rank >= world)):
        of = f"rank of a world of {world}" if world is not None else "rank (0 to 2^31-1)"
        warnings.append(f"distributedInfo rank {rank} is no {of}: left out")
        rank = None
    rank_from = "distributedInfo"
    if rank is None:
        rank = rank_from_file_name(path.name, warnings)
        rank_from = "file name"
        if info and rank is not None:
            warnings.append("distributedInfo has no rank; rank taken from the file name")
    if rank is None:
        rank_from = "unknown"
    pg_config = info.get("pg_config")
    memory = {str(d["id"]): as_int(d.get("totalGlobalMem")) for d in devices
              if isinstance(d, dict) and "id" in d and as_int(d.get("totalGlobalMem"))
              } if isinstance(devices, list) else {}
    return RankInfo(
        rank=rank,
        world_size=world,
        host=header.get("host_name") if isinstance(header.get("host_name"), str) else None,
        devices=names,
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        clock_base_ns=base_ns or None,
        rank_from=rank_from,
        pg_config=msgspec.json.encode(pg_config).decode() if pg_config is not None else None,
        device_memory=msgspec.json.encode(memory).decode() if memory else None,
    )
