"""Merges tuning caches (the JSON files that `clnet tune` and `clnet bench` write, e.g. fetched from a lent H200)
into the table shipped in the package, clnet/tuning_table.json, keyed by platform, device and driver family.

    python3 bench/ship_tuning.py bench/results/h200-v14/tuning-v2.json [more caches...]

Entries of a newer cache replace the table's for the same family and key; other families and keys stay. The cache's
version must be the package's (tuning.CACHE_VERSION): older winners may name choices this version no longer has.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from clnet import tuning  # noqa: E402
from clnet.files import write_atomically  # noqa: E402


def main(paths):
    try:
        with open(tuning.SHIPPED_TABLE) as f:
            table = json.load(f)
    except FileNotFoundError:
        table = dict(cache_version=tuning.CACHE_VERSION, devices={})
    if table.get("cache_version") != tuning.CACHE_VERSION:
        table = dict(cache_version=tuning.CACHE_VERSION, devices={})
    for path in paths:
        if not os.path.basename(path).startswith(f"tuning-v{tuning.CACHE_VERSION}."):
            sys.exit(f"{path}: not a tuning-v{tuning.CACHE_VERSION} cache (this clnet's cache version)")
        with open(path) as f:
            cache = json.load(f)
        for device, found in cache.items():
            family = tuning.family_key(device)
            table["devices"].setdefault(family, {}).update(
                (k, v) for k, v in found.items() if not k.startswith(tuning.FIRST_RUN_MARK))  # a run's, not a device's
            print(f"{family}: {len(found)} entries from {path} ({len(table['devices'][family])} in the table)")
    write_atomically(tuning.SHIPPED_TABLE, lambda f: json.dump(table, f, indent=1, sort_keys=True), text=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
