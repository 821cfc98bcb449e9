#!/usr/bin/env python3
"""Recomputes a flashsale draw from what the service publishes, with Python's standard library
only, so that anyone can check the winners without trusting the service.

Usage: draw-verify.py DRAW_JSON        (the body of GET /api/v1/sales/{sku_id}/draw; '-' = stdin)

The algorithm (flashsale_core::admission):
  1. The seed (32 bytes, published in hex after the draw) must hash to the commitment published
     when entries opened: SHA-256(seed) == seed_sha256.
  2. Each entry's rank key is SHA-256(seed || user_id as 8 bytes big-endian); the waitlist is the
     entries sorted by (rank key, user_id).
  3. Walking the waitlist with the stock (total_stock), an entry wins when its quantity fits in
     the stock left; the stock left drops by its quantity.
Exits 0 and prints "OK" when the published winners are exactly the recomputed ones (same
entries, same order); otherwise prints the first difference and exits 1.
"""
import hashlib
import json
import sys


def waitlist(seed, entries):
    def key(e):
        uid = int(e["user_id"])
        return (hashlib.sha256(seed + uid.to_bytes(8, "big")).digest(), uid)

    return sorted(entries, key=key)


def winners(seed, entries, stock):
    left = stock
    won = []
    for e in waitlist(seed, entries):
        q = int(e["quantity"])
        if q <= left:
            left -= q
            won.append({"user_id": int(e["user_id"]), "quantity": q})
    return won


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    text = sys.stdin.read() if argv[1] == "-" else open(argv[1], encoding="utf-8").read()
    draw = json.loads(text)
    if not draw.get("seed"):
        print("the seed is not revealed yet (the draw has not happened)")
        return 1
    seed = bytes.fromhex(draw["seed"])
    if hashlib.sha256(seed).hexdigest() != draw["seed_sha256"]:
        print("the seed does not match its published SHA-256")
        return 1
    users = [int(e["user_id"]) for e in draw["entries"]]
    if len(set(users)) != len(users):
        print("an entry list with a user twice")
        return 1
    expected = winners(seed, draw["entries"], int(draw["total_stock"]))
    published = [{"user_id": int(w["user_id"]), "quantity": int(w["quantity"])} for w in draw["winners"]]
    if expected != published:
        for i, (a, b) in enumerate(zip(expected, published)):
            if a != b:
                print(f"winner {i + 1}: recomputed {a}, published {b}")
                return 1
        print(f"{len(expected)} winners recomputed, {len(published)} published")
        return 1
    print(f"OK: {len(expected)} winners of {len(users)} entries recomputed from the seed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
