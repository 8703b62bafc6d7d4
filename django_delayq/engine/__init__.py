"""The Redis engine of django-delayq. It never imports Django.

It takes a redis-py client (``decode_responses=True``) and an :class:`EngineConfig`, so
Spark executors, benchmarks and scripts can use it bare.
"""

from .broker import Broker
from .claims import ClaimedJob, ClaimResult
from .codec import JSONEncoder, encode_arguments, encode_result
from .commands import EncodedJob
from .config import EngineConfig
from .errors import (
    AckRefused,
    DelayQConnectionError,
    DelayQError,
    InvalidJobState,
    JobAborted,
    JobNotFound,
    JobTimeout,
    NotReplicated,
    PartialClaimError,
    PayloadTooLarge,
    ResultTooLarge,
    UnknownTask,
)
from .job import Job, set_default_broker
from .keys import GlobalKeys, QueueKeys
from .queue import Queue
from .requests import BulkResult, EnqueueRequest, EnqueueResult
from .status import STATUSES, Status

__all__ = [
    "STATUSES",
    "AckRefused",
    "Broker",
    "BulkResult",
    "ClaimResult",
    "ClaimedJob",
    "DelayQConnectionError",
    "DelayQError",
    "EncodedJob",
    "EngineConfig",
    "EnqueueRequest",
    "EnqueueResult",
    "GlobalKeys",
    "InvalidJobState",
    "JSONEncoder",
    "Job",
    "JobAborted",
    "JobNotFound",
    "JobTimeout",
    "NotReplicated",
    "PartialClaimError",
    "PayloadTooLarge",
    "Queue",
    "QueueKeys",
    "ResultTooLarge",
    "Status",
    "UnknownTask",
    "encode_arguments",
    "encode_result",
    "set_default_broker",
]
