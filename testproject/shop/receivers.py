"""The shop's ``order_expired`` receiver: records each delivery, in the closing transaction.

For tests that drive a consumer in another process, two environment variables
change its behaviour: SHOP_STALL_FILE makes the first delivery create that file
and hang (so the test can kill the consumer mid-batch), SHOP_DELAY_SECONDS
slows every delivery (so a batch is still in hand when a signal arrives).
"""

import os
import time
from pathlib import Path
from typing import Any

from .models import Expiry


def record_expiry(sender: Any, order: Any, **kwargs: Any) -> None:
    Expiry.objects.create(order_id=str(order.pk), model=sender._meta.label)
    stall_file = os.environ.get("SHOP_STALL_FILE")
    if stall_file:
        Path(stall_file).touch()
        time.sleep(3600)
    delay = float(os.environ.get("SHOP_DELAY_SECONDS", "0"))
    if delay:
        time.sleep(delay)
