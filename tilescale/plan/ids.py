"""Content-hashed ids: the canonical JSON of a plan's inputs and its hash (what plan ids and the plan cache's
checks compute)."""
import base64
import hashlib
import json


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def hash_id(payload) -> str:
    """32 lower-case base32 characters of blake2b(canonical_json(payload))."""
    digest = hashlib.blake2b(canonical_json(payload).encode(), digest_size=20).digest()
    return base64.b32encode(digest).decode().lower()[:32]
