"""A mirror that waits between its database commit and its ack, for the crash test.

``python -m tests.slow_ack_mirror`` (with the test settings in the environment) mirrors
in batches of 250 and says ``pausing before ack`` before each ack, so the test can kill
it at the one moment where a crash leaves rows written but entries unacknowledged.
"""

from __future__ import annotations

import time

import django


def main() -> None:
    django.setup()
    from django_delayq.engine.keys import QueueKeys
    from django_delayq.engine.streams import StreamBatch
    from django_delayq.mirror import Mirror

    class SlowAckMirror(Mirror):
        def _acknowledge(self, keys: QueueKeys, batch: StreamBatch) -> None:
            print(f"mirror wrote batch, pausing before ack entries={len(batch.entries)}",
                  flush=True)
            time.sleep(0.2)
            super()._acknowledge(keys, batch)

    SlowAckMirror(batch_size=250, name="doomed").run()


if __name__ == "__main__":
    main()
