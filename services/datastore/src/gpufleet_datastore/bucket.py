"""The operator's S3-compatible bucket of platform objects (boto3): presigned URLs, an
object's size and checksum, removal. The credentials stay here: nodes get presigned URLs."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal

from gpufleet_contracts.clock import Clock
from gpufleet_contracts.errors import Refused
from pydantic import SecretStr
from pymongo.asynchronous.database import AsyncDatabase

NOT_CONFIGURED = (
    "platform objects are not configured on this installation: its operator sets the "
    "datastore's GPUFLEET_PLATFORM_BUCKET (and its endpoint and keys)"
)


@dataclass(frozen=True)
class Stored:
    """An object as the store has it."""

    size: int
    sha256: str | None  # the store's SHA-256 checksum, when it keeps one; else the ETag
    etag: str


class Bucket:
    def __init__(
        self,
        endpoint: str,
        bucket: str,
        access_key_id: str,
        secret_access_key: SecretStr,
        region: str,
    ) -> None:
        import boto3
        from botocore.config import Config

        self.name = bucket
        self._client: Any = boto3.client(
            "s3",
            endpoint_url=endpoint or None,
            aws_access_key_id=access_key_id or None,
            aws_secret_access_key=secret_access_key.get_secret_value() or None,
            region_name=region,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
        )

    def __repr__(self) -> str:  # never the keys
        return f"Bucket({self.name!r})"

    def presigned(self, key: str, method: str, ttl_s: int) -> str:
        """A URL to GET or PUT `key` for `ttl_s` seconds (signed here: no request is made)."""
        op = "get_object" if method == "GET" else "put_object"
        url: str = self._client.generate_presigned_url(
            op, Params={"Bucket": self.name, "Key": key}, ExpiresIn=ttl_s
        )
        return url

    async def stored(self, key: str) -> Stored | None:
        """The object's size and checksum, or None when nothing is there."""

        def head() -> Stored | None:
            from botocore.exceptions import ClientError

            try:
                found = self._client.head_object(Bucket=self.name, Key=key, ChecksumMode="ENABLED")
            except ClientError as exc:
                if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey"):
                    return None
                raise
            sha = found.get("ChecksumSHA256")
            return Stored(
                size=int(found["ContentLength"]),
                sha256=base64.b64decode(sha).hex() if sha else None,
                etag=str(found.get("ETag", "")).strip('"'),
            )

        return await asyncio.to_thread(head)

    async def sha256(self, key: str) -> str:
        """The object's SHA-256, read through (for a store that keeps no checksum)."""

        def read() -> str:
            body = self._client.get_object(Bucket=self.name, Key=key)["Body"]
            digest = hashlib.sha256()
            for chunk in iter(lambda: body.read(1 << 20), b""):
                digest.update(chunk)
            return digest.hexdigest()

        return await asyncio.to_thread(read)

    async def remove(self, key: str) -> None:
        await asyncio.to_thread(self._client.delete_object, Bucket=self.name, Key=key)

    async def ensure(self) -> None:
        """Make the bucket if it is missing (the devstack's; an operator's exists)."""

        def make() -> None:
            from botocore.exceptions import ClientError

            try:
                self._client.head_bucket(Bucket=self.name)
            except ClientError:
                self._client.create_bucket(Bucket=self.name)

        await asyncio.to_thread(make)


class Granted:
    """A collection of objects in the platform bucket that this service hands presigned URLs
    to (objects.py, relay.py): its documents, the bucket (None: not configured, every grant
    refused saying so) and how long a URL lasts."""

    COLLECTION: ClassVar[str]

    def __init__(
        self, db: AsyncDatabase[dict[str, Any]], bucket: Bucket | None, clock: Clock, ttl_s: int
    ) -> None:
        self.coll = db[self.COLLECTION]
        self.bucket = bucket
        self.clock = clock
        self.ttl_s = ttl_s

    def _bucket(self) -> Bucket:
        if self.bucket is None:
            raise Refused("unavailable", NOT_CONFIGURED)
        return self.bucket

    def presigned(self, key: str, method: Literal["GET", "PUT"]) -> tuple[str, datetime]:
        """A URL for `method` on `key`, and when it expires."""
        url = self._bucket().presigned(key, method, self.ttl_s)
        return url, self.clock() + timedelta(seconds=self.ttl_s)
