"""What a text the app writes may show: no password (check messages, log lines, exception texts),
and, in a log line, no line break.

A Redis LOCATION carries its password in the URL (``redis://user:password@host``), and
LOCATIONs end up in messages (a cluster's seeds that differ, a node that does not answer).
Everything the app says about a URL goes through ``masked`` first; an error a log line quotes
goes through ``one_line``.
"""

from __future__ import annotations

import re
from typing import Any

# scheme://user:password@ -> scheme://user:***@ (the user stays: it says which ACL user).
_CREDENTIALS = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/\s'\"]*):[^@/\s'\"]*@")
MASK = "***"


def masked(text: Any) -> str:
    """``text`` (or its ``str()``) with the password of every URL in it replaced by ``***``."""
    return _CREDENTIALS.sub(rf"\g<scheme>\g<user>:{MASK}@", str(text))


def one_line(text: Any) -> str:
    """``text`` (or its ``str()``) on one line: a driver's error that runs over several (psycopg's
    does) would break a log line that an alert matches line by line."""
    return " ".join(str(text).split())
