"""The Redis engine of django-delayq. It never imports Django.

It takes a redis-py client (``decode_responses=True``) and an :class:`EngineConfig`, so
Spark executors, benchmarks and scripts can use it bare.
"""

from .broker import (
    Broker,
    BulkResult,
    ClaimedJob,
    ClaimResult,
    EnqueueRequest,
    EnqueueResult,
)
from .codec import JSONEncoder, encode_arguments, encode_result
from .config import EngineConfig
from .errors import (
    DelayQConnectionError,
    DelayQError,
    InvalidJobState,
    JobNotFound,
    PartialClaimError,
    PayloadTooLarge,
    UnknownTask,
)
from .job import Job, set_default_broker
from .keys import STATUSES, GlobalKeys, QueueKeys
from .queue import Queue

__all__ = [
    "STATUSES",
    "Broker",
    "BulkResult",
    "ClaimResult",
    "ClaimedJob",
    "DelayQConnectionError",
    "DelayQError",
    "EngineConfig",
    "EnqueueRequest",
    "EnqueueResult",
    "GlobalKeys",
    "InvalidJobState",
    "JSONEncoder",
    "Job",
    "JobNotFound",
    "PartialClaimError",
    "PayloadTooLarge",
    "Queue",
    "QueueKeys",
    "UnknownTask",
    "encode_arguments",
    "encode_result",
    "set_default_broker",
]
