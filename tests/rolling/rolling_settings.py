"""Settings of every process of the rolling-upgrade test (``tests/test_rolling_upgrade.py``),
whichever release runs it: that release's own test project (the ``testproject`` first on the
path: the release's tree, or this checkout), plus the shop's receiver of this test and the retry
delays it runs with, so both releases close, retry and bury the same way."""

import json
import os

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS, LOGGING, ORDER_TIMEOUT

INSTALLED_APPS = [*INSTALLED_APPS, "rolling_receivers.RollingReceivers"]
ORDER_TIMEOUT = {**ORDER_TIMEOUT, "RETRY_DELAYS": json.loads(os.environ["ROLLING_RETRY_DELAYS"])}
LOGGING = {**LOGGING, "loggers": {**LOGGING["loggers"], "rolling": {"handlers": ["console"], "level": "INFO"}}}
