"""The shop's background jobs: what a real project would send to django-delayq."""

from __future__ import annotations

import hashlib
import time
from decimal import Decimal

from django_delayq import task
from django_delayq.connection import get_broker


@task(queue="emails", delay=2, max_attempts=5)
def send_receipt(order_id: int, *, template: str = "receipt") -> str:
    """Render and 'send' an order receipt a couple of seconds after checkout."""
    time.sleep(0.05)
    return f"receipt #{order_id} sent with template {template!r}"


@task(queue="payments", max_attempts=3)
def charge_card(order_id: int, amount: Decimal) -> dict[str, str]:
    """Charge the customer's card (a stand-in for a payment gateway call)."""
    time.sleep(0.1)
    reference = hashlib.sha256(f"{order_id}:{amount}".encode()).hexdigest()[:12]
    return {"order": str(order_id), "amount": str(amount), "reference": reference}


@task(queue="default", max_attempts=4)
def sync_inventory(sku: str) -> str:
    """Push stock levels to a flaky warehouse API: the first try of each SKU times out."""
    client = get_broker().client
    tries = client.incr(f"shop:demo:sync-tries:{sku}")
    client.expire(f"shop:demo:sync-tries:{sku}", 3600)
    if tries == 1:
        raise TimeoutError(f"warehouse API timed out for {sku}")
    return f"{sku} synced after {tries} tries"


@task(queue="default")
def nightly_report(day: str) -> str:
    """Build a sales report for ``day``."""
    time.sleep(0.2)
    return f"report for {day}: 3 orders"
