"""The transfer engine: the bytes of remote files into local files, in parallel, resumable, verified.

Role: the data path every source that can address bytes over HTTP uses (S3 and OCI presigned or signed
URLs, GCS and Azure signed URLs, Hugging Face LFS files behind their CDN, plain HTTP origins). A source
decides *which* files to fetch, with which credentials and against which checksums; this package moves the
bytes of each file as fast as the link allows, with bounded memory, and says whether they are the bytes the
source promised. It knows no scheme, no Kubernetes object and no manifest.

Use::

    async with engine_session(RangedConfig(...)) as engine:
        done = await engine.download(url, path, Expected(size, {"md5": ...}, validator=etag),
                                     state_path=part_map_path(staging, rel), label=rel)

Guarantees (each one is tested in ``tests/unit/test_transfer_*.py``):

1. **Verified or not there.** :meth:`RangedDownloader.download` returns only after the file's size matches
   and its sha256 (always; the manifest keeps it) and every checksum the source supplied (``md5``,
   ``sha1``, ``sha256``, ``crc32``, ``crc32c``, ``git-sha1``) were computed over the file as it is on disk and match,
   and the file was fsynced. For a file fetched in one request, the source may let the answer state more of them
   (``Expected.checksums_from_answer``, read from its headers before a byte of its body is hashed). A mismatch
   deletes the file and its part map and raises ``VerificationFailed``. Bodies are taken as stored (no
   decompression): the bytes written are the bytes hashed.
2. **Resume re-fetches at most the parts in flight.** Progress is a part map (:mod:`.partmap`) replaced
   atomically; a part is recorded only after its bytes were written and, with ``durable`` (default),
   fdatasync-ed, so after a crash of the process or the node the map never claims bytes that are not on
   disk. A part's slot is given back only once its record is written, so parts in flight plus parts done
   but unrecorded never exceed ``concurrency``: a SIGKILL at any instant costs at most
   ``concurrency x part_size`` bytes fetched again. A restart with the same size and validator fetches
   exactly the unrecorded parts; another validator or size (the remote file changed) discards the
   progress. A completed map with the digests makes a later call return at once.
3. **Memory bounded independent of file size.** Up to ``concurrency`` parts are in flight across *all*
   files of one downloader (a shared slot pool); memory is ``concurrency x (write_buffer or the 1 MiB
   pipe)`` plus socket buffers, plus one :data:`~.hashing.HASH_WINDOW` mapped per hasher while it runs,
   whatever the file or part size.
4. **Full disk shows up first.** The target is preallocated (``fallocate``, else ``ftruncate``); ENOSPC or
   EDQUOT while preallocating or writing raise ``InsufficientDisk`` and keep the partial file and its map
   for a resume once space is freed.
5. **Retries are the engine's, final answers the source's.** A failed part is retried from the last byte
   written: connection errors, timeouts, short bodies, 408 and 5xx with exponential backoff and jitter;
   429 and 503 honour ``Retry-After`` (capped) and pause every part of the downloader.
   ``max_attempts`` consecutive failures without progress end the download. 401/403, 404, 412 (the
   validator, sent as ``If-Match``, no longer matches) and 416 are not retried; they become a
   :class:`~model_agent.model.errors.SourceError` for the source's own policy (:mod:`.answers`).
6. **Never more than asked.** No byte past the part is read into the file, whatever the server sends (past the
   file's end, for the one whole answer that is read on as the file's stream, below);
   every ``Content-Range`` / ``Content-Length`` must agree with the expected size. A server that ignores
   ``Range`` is detected on its first whole answer and read as one stream: the whole answer to the first part's
   request is read on to the end (other part requests are dropped); each retry restarts at 0.
   No redirect is followed: a 3xx answer raises :class:`Redirected` (a ``SourceError``), so a caller that
   allows one can look the location up through its own checks and ask again.
7. **Cancellation is prompt and clean.** ``download`` may be cancelled at any ``await``: requests stop
   within one buffer (a flag) or at once when blocked on the network (the socket is shut down), every
   thread that may use the descriptor is waited for, the parts completed so far are recorded, and the
   cancellation is re-raised.
8. **No secret in a message.** Messages name the caller's ``label``, never the URL (presigned URLs carry
   credentials).

How (the modules, in the order the data meets them): :mod:`.config` (tuning, the source's promise, the
result), :mod:`.engine` (the downloader: slots, threads, TLS, the shared pause), :mod:`.job` (one file:
parts, records, hashing, verification), :mod:`.partmap` (the resume record), :mod:`.transport` (one
keep-alive ``http.client`` connection per slot; TLS trust, proxies, the tenant connect guard),
:mod:`.pacing` (how many small files at once: as many as the origin's wait needs),
:mod:`.splice` (zero-copy receive on plain TCP), :mod:`.answers` (what a response means),
:mod:`.hashing` (checksums over the page cache), :mod:`.disk` (preallocation, disk errors), :mod:`.aio`
(thread work that can be waited for, task groups). One writer thread at a time per file; hashing runs
beside the transfer over the completed prefix, and the receive is held within one round of slots
(``concurrency x part_size``) of it, so verification ends moments after the last byte lands. Why each
choice, with the measurements: ``bench/RANGED_HISTORY.md`` and ``docs/performance.md``.
"""

from model_agent.transfer.aio import gather_or_cancel, largest_first, run_all
from model_agent.transfer.answers import Redirected, parse_retry_after
from model_agent.transfer.config import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PART_SIZE,
    DEFAULT_WRITE_BUFFER,
    Downloaded,
    Expected,
    HeaderSource,
    RangedConfig,
    UrlSource,
)
from model_agent.transfer.engine import RangedDownloader, engine_session
from model_agent.transfer.hashing import SUPPORTED_CHECKSUMS, b64_to_hex, file_checksums
from model_agent.transfer.job import fetched_in_one_request
from model_agent.transfer.partmap import PARTS_DIR, part_map_name, part_map_path
from model_agent.transfer.transport import CONNECT_GUARD

__all__ = [
    "CONNECT_GUARD",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_PART_SIZE",
    "DEFAULT_WRITE_BUFFER",
    "PARTS_DIR",
    "SUPPORTED_CHECKSUMS",
    "Downloaded",
    "Expected",
    "HeaderSource",
    "RangedConfig",
    "RangedDownloader",
    "Redirected",
    "UrlSource",
    "b64_to_hex",
    "engine_session",
    "fetched_in_one_request",
    "file_checksums",
    "gather_or_cancel",
    "largest_first",
    "parse_retry_after",
    "part_map_name",
    "part_map_path",
    "run_all",
]
