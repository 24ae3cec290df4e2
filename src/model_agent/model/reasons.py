"""The agent's vocabulary of reasons: every machine-readable word it writes about a model or the node.

Role: one place that names each ``reason`` the agent writes, so a reader (an operator's alert, a dashboard, a
test) can rely on the exact words and a writer cannot misspell one. The values are the wire strings themselves:
both enums are :class:`~enum.StrEnum`, so ``str(Reason.NO_OBJECTS) == "NoObjects"`` and a member can be passed
wherever a reason string was, byte-identical in the ConfigMap entry, the Event and the log.

Contract:

* :class:`Reason` is why a model is ``Failed`` (the entry's ``reason`` field ``"<Reason>: <message>"``, the
  Warning Event on the model, the ``model failed`` log line) or why a fetch stopped and will be retried.
  OME's own agent writes no ``reason`` field (docs/ome-compatibility.md#63-configmap-entry-value), so OME's
  readers never parse these words; operators do, so a value is never renamed, only added.
* :class:`EventReason` is the ``reason`` of an Event that reports something other than a failure (a fetch
  that finished, a removal held or done, the delete breaker).
* Every value of both is documented in docs/operations.md#reasons (``tests/unit/test_reasons.py`` fails on
  one that is not).
* ``UnsafePath`` and ``UnsafeFilePath`` are two reasons on purpose, both written today: ``UnsafeFilePath`` is
  a file name a source listed (an object key, a hub path) that would escape the model's directory, refused
  before a byte is fetched; ``UnsafePath`` is the publish step's last check of what it is about to write (a
  destination that is not normalised or not inside its root, a staged path that is not plain, a symlinked or
  non-directory component on the way). Merging them would change what an alert on either matches.

No I/O here: this module is data.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Why a model failed (or a fetch stopped): the first word of a Failed entry's ``reason``."""

    # The object and its spec: fail at once, no retry until the spec changes.
    INVALID_MODEL = "InvalidModel"
    INVALID_STORAGE_URI = "InvalidStorageUri"
    UNSUPPORTED_STORAGE_URI = "UnsupportedStorageUri"
    INVALID_PARAMETER = "InvalidParameter"
    INVALID_PATH = "InvalidPath"
    PATH_REFUSED = "PathRefused"
    PATH_CONFLICT = "PathConflict"
    UNSUPPORTED_STORAGE = "UnsupportedStorage"
    LOCAL_PATH_NOT_FOUND = "LocalPathNotFound"
    LOCAL_FILES_CHANGED = "LocalFilesChanged"
    QUARANTINED_AFTER_CRASH = "QuarantinedAfterCrash"  # the agent died during this spec's risky step 3 times

    # Credentials and tenancy.
    SECRET_NOT_FOUND = "SecretNotFound"
    SECRET_FORBIDDEN = "SecretForbidden"
    SECRET_INVALID = "SecretInvalid"
    NO_CREDENTIALS = "NoCredentials"
    CREDENTIAL_REFUSED = "CredentialRefused"
    ENDPOINT_REFUSED = "EndpointRefused"
    SIGNING_FAILED = "SigningFailed"
    UNAUTHORIZED = "Unauthorized"
    ACCESS_DENIED = "AccessDenied"

    # What the store said about the model.
    REPOSITORY_NOT_FOUND = "RepositoryNotFound"
    REVISION_NOT_FOUND = "RevisionNotFound"
    FILE_NOT_FOUND = "FileNotFound"
    BUCKET_NOT_FOUND = "BucketNotFound"
    NAMESPACE_NOT_FOUND = "NamespaceNotFound"
    OBJECT_NOT_FOUND = "ObjectNotFound"
    NO_OBJECTS = "NoObjects"
    LISTING_TOO_LARGE = "ListingTooLarge"
    UNSAFE_FILE_PATH = "UnsafeFilePath"

    # The transfer: retryable unless the message says otherwise.
    RATE_LIMITED = "RateLimited"
    SOURCE_UNREACHABLE = "SourceUnreachable"
    SOURCE_ERROR = "SourceError"
    TLS_ERROR = "TLSError"
    HTTP_ERROR = "HttpError"
    BAD_REQUEST = "BadRequest"
    BAD_RESPONSE = "BadResponse"
    SOURCE_CHANGED = "SourceChanged"
    DOWNLOAD_FAILED = "DownloadFailed"
    DOWNLOAD_TIMEOUT = "DownloadTimeout"
    DOWNLOAD_TOO_SLOW = "DownloadTooSlow"
    VERIFICATION_FAILED = "VerificationFailed"

    # The node's disk and the publish step.
    INSUFFICIENT_DISK = "InsufficientDisk"
    WRITE_FAILED = "WriteFailed"
    UNSAFE_PATH = "UnsafePath"

    # A fetch overtaken by the spec or held back: not shown as Failed, retried by the reconciler.
    OBSOLETE = "Obsolete"
    SWITCH_DEFERRED = "SwitchDeferred"


class EventReason(StrEnum):
    """The ``reason`` of an Event that is not a model failure (a failure's Event carries its :class:`Reason`)."""

    FETCHED = "Fetched"
    RESTORED = "Restored"
    REMOVED = "Removed"
    REMOVAL_HELD = "RemovalHeld"
    REMOVAL_FAILED = "RemovalFailed"
    CORRUPTED = "Corrupted"
    PLAINTEXT_TOKEN = "PlaintextToken"
    FORBIDDEN = "Forbidden"
    DELETE_BREAKER_OPEN = "DeleteBreakerOpen"
    DELETE_BREAKER_CLOSED = "DeleteBreakerClosed"
    CONFIGMAP_FULL = "ConfigMapFull"
    CONFIGMAP_ROOM = "ConfigMapRoom"
    WAITING_FOR_PEER = "WaitingForPeer"
