"""Passwords out of every text the app writes: check messages, log lines, exception texts.

A Redis LOCATION carries its password in the URL (``redis://user:password@host``), and
LOCATIONs end up in messages (a cluster's seeds that differ, a node that does not answer).
Everything the app says about a URL goes through ``masked`` first.
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
