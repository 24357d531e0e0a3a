"""The one start-up line a service prints on stdout: the ports it got (for --port 0).

Scripts and devtools/cluster.py read it to learn where a service listens. Two
forms, one meaning:
- plain: `listening HOST:PORT` (the scheduler adds ` internal HOST:PORT`);
- with JSON logs: one JSON object shaped like a log record,
  `{"event": "listening", "address": "HOST:PORT", "internal_address": ...,
  "level": "info", "logger": ..., "timestamp": ...}`, because in a container
  stdout and stderr reach the same collector, and one plain line in a JSON
  stream breaks the collector's parsing.
`parse` reads both; a reader should use it rather than split the text.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass

from ortserve.process.logs import json_enabled


@dataclass(frozen=True)
class Banner:
    address: str  # HOST:PORT of the service's (public) port
    internal_address: str = ""  # the scheduler's worker-facing port; "" for the others

    def plain(self) -> str:
        internal = f" internal {self.internal_address}" if self.internal_address else ""
        return f"listening {self.address}{internal}"


def line(banner: Banner, program: str, as_json: bool) -> str:
    if not as_json:
        return banner.plain()
    record = {"event": "listening", "address": banner.address}
    if banner.internal_address:
        record["internal_address"] = banner.internal_address
    record.update(level="info", logger=program,
                  timestamp=datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z"))
    return json.dumps(record)


def announce(banner: Banner, program: str) -> None:
    """Print the banner on stdout, in the form the logs take (JSON or plain)."""
    print(line(banner, program, json_enabled()), flush=True)


def parse(text: str) -> Banner | None:
    """The banner in either form, or None when `text` is not one."""
    text = text.strip()
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except ValueError:
            return None
        if not isinstance(record, dict) or record.get("event") != "listening":
            return None
        return Banner(str(record.get("address", "")), str(record.get("internal_address", "")))
    words = text.split()
    if len(words) < 2 or words[0] != "listening":
        return None
    internal = words[words.index("internal") + 1] if "internal" in words[:-1] else ""
    return Banner(words[1], internal)
