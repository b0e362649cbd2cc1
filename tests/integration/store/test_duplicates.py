"""Which unique key a write collided on (gpufleet_store/duplicates.py): the server's
`keyPattern` when it gives one (MongoDB), else the keys looked up (nx-27017 gives none);
never the error's text."""

from __future__ import annotations

import pytest
from gpufleet_devstack import EmbeddedMongo
from gpufleet_store.duplicates import colliding_key, key_pattern
from pymongo import ASCENDING, AsyncMongoClient, IndexModel
from pymongo.errors import DuplicateKeyError

KEYS = (("region", "name"), ("minion",))


def mongodb_error(pattern: dict[str, int], text: str) -> DuplicateKeyError:
    """A DuplicateKeyError as MongoDB 7 raises it: its text names the values."""
    return DuplicateKeyError(
        text, 11000, {"code": 11000, "keyPattern": pattern, "keyValue": {}, "errmsg": text}
    )


async def test_the_key_named_by_the_server_wins_over_the_text_and_the_lookup(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(mongo_server.url)
    try:
        coll = client[f"{db_prefix}_dup"]["things"]
        await coll.create_indexes(
            [
                IndexModel([("region", ASCENDING), ("name", ASCENDING)], unique=True),
                IndexModel([("minion", ASCENDING)], unique=True),
            ]
        )
        await coll.insert_one({"_id": 1, "region": "r", "name": "minion", "minion": "m-1"})

        # the server at hand (nx-27017) names no key: the one another document holds is found
        clash = {"_id": 2, "region": "r", "name": "minion", "minion": "m-2"}
        with pytest.raises(DuplicateKeyError) as raised:
            await coll.insert_one(clash)
        assert await colliding_key(raised.value, coll, clash, KEYS) == 0
        clash = {"_id": 3, "region": "r", "name": "other", "minion": "m-1"}
        with pytest.raises(DuplicateKeyError) as raised:
            await coll.insert_one(clash)
        assert await colliding_key(raised.value, coll, clash, KEYS) == 1

        # MongoDB's error: the key pattern says, though the text names "minion" (a value)
        text = 'E11000 duplicate key error dup key: { region: "r", name: "minion" }'
        exc = mongodb_error({"region": 1, "name": 1}, text)
        assert key_pattern(exc) == frozenset({"region", "name"})
        assert await colliding_key(exc, coll, clash, KEYS) == 0
        assert await colliding_key(mongodb_error({"minion": 1}, text), coll, clash, KEYS) == 1
        # a key of none of those given: not guessed
        assert await colliding_key(mongodb_error({"_id": 1}, text), coll, clash, KEYS) is None
    finally:
        await client.close()
