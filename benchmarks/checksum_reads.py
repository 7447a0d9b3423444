"""What verifying a checksum chunk costs the reader, by how the chunk is read: the question behind fast_io's choice
of digesting each 16 MiB request after one preadv rather than reading it in small parts digested while in cache.

    python benchmarks/checksum_reads.py [--size-mb 512] [--rounds 15]

A file of `--size-mb` (in the page cache) is read as fast_io reads it: 16 MiB requests on 4 threads, each into fresh,
untouched memory (as `_buffer` gives), either in one preadv per request or in parts of 4 MiB / 1 MiB / 256 KiB, with
and without an xxh3-64 digest of each part right after it arrived. Prints the median CPU time (all threads) and wall
time per GB of each way, measured in alternating rounds. The file is deleted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import xxhash

REQUEST = 16 * 2**20


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    size = args.size_mb * 2**20 // REQUEST * REQUEST
    handle, path = tempfile.mkstemp(prefix="hasten-checksum-reads-")
    try:
        block = os.urandom(2**20)
        for _ in range(size // 2**20):
            os.write(handle, block)
        pool = ThreadPoolExecutor(4)

        def read(part: int, hashing: bool) -> None:
            memory = memoryview(torch.empty(size, dtype=torch.uint8).numpy())

            def request(offset: int) -> None:
                running = xxhash.xxh3_64()
                for start in range(offset, offset + REQUEST, part):
                    view = memory[start:start + part]
                    os.preadv(handle, [view], start)
                    if hashing:
                        running.update(view)

            list(pool.map(request, range(0, size, REQUEST)))

        ways = [(part, hashing) for part in (REQUEST, 4 * 2**20, 2**20, 2**18) for hashing in (False, True)]
        cpu, wall = {way: [] for way in ways}, {way: [] for way in ways}
        read(REQUEST, False)  # the file into the page cache
        for _ in range(args.rounds):
            for way in ways:
                start, start_cpu = time.perf_counter(), time.process_time()
                read(*way)
                wall[way].append(time.perf_counter() - start)
                cpu[way].append(time.process_time() - start_cpu)
        gigabytes = size / 1e9
        print(f"{args.size_mb} MB from the page cache, 4 threads, medians of {args.rounds} rounds (ms per GB):")
        for part, hashing in ways:
            print(f"  parts of {part >> 10:6d} KiB, {'digested' if hashing else 'not digested':12s} "
                  f"CPU {statistics.median(cpu[part, hashing]) * 1e3 / gigabytes:7.1f}   "
                  f"wall {statistics.median(wall[part, hashing]) * 1e3 / gigabytes:7.1f}")
    finally:
        os.close(handle)
        os.unlink(path)


if __name__ == "__main__":
    main()
