"""An eval host's `sglang` section: how `fab served-eval` starts an SGLang server of its own
there (docs/served.md). It never touches the server `sglang_url` names: that one is the
user's; this one is started, watched and stopped by the tool.

```yaml
    sglang:
      python: /opt/sglang/.venv/bin/python   # the python of the SGLang environment
      gpus: [0, 1]                           # CUDA_VISIBLE_DEVICES; busy ones are refused
      ports: 30100-30199                     # the first free one is used
      start_timeout: 900                     # seconds until /health answers
```
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from dflash_ops.core.features_host import GpuList
from dflash_ops.core.strict import Strict

MIN_PORT, MAX_PORT = 1024, 65535


def _absolute(path: str) -> str:
    if not path.startswith("/") or any(c in path for c in "\n\0"):
        raise ValueError("an absolute path to the python of the SGLang environment")
    return path


def _port_range(text: str) -> str:
    found = re.fullmatch(r"(\d+)-(\d+)", str(text).strip())
    if not found or not MIN_PORT <= int(found[1]) <= int(found[2]) <= MAX_PORT:
        raise ValueError(f"a port range FIRST-LAST within {MIN_PORT}-{MAX_PORT}, e.g. 30100-30199")
    return str(text).strip()


class SglangLaunch(Strict):
    python: Annotated[str, AfterValidator(_absolute)]
    gpus: GpuList
    ports: Annotated[str, AfterValidator(_port_range)]
    start_timeout: int = Field(default=900, ge=1, le=7200)

    def port_numbers(self) -> range:
        first, last = self.ports.split("-")
        return range(int(first), int(last) + 1)
