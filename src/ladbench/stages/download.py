"""Stage `download`: fetch and extract MS-COCO val2014 or Flickr8k, resumable and verified;
the work is in :mod:`ladbench.data.download`."""

from __future__ import annotations

import argparse

from ladbench.data.download import DATASETS, download_dataset


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "download", help="Download and extract MS-COCO val2014 or Flickr8k (resumable, verified).",
        description="Download the dataset's archives with resume and retries, verify them, extract the needed "
                    "files into --dest; archives whose outputs exist are skipped.")
    parser.add_argument("--dataset", required=True, choices=sorted(DATASETS), help="coco (val2014) or flickr8k.")
    parser.add_argument("--dest", required=True, help="Folder the files are extracted into.")
    parser.add_argument("--url-base", default=None, help="Fetch every archive from URL_BASE/<file name> (a mirror).")
    parser.add_argument("--retries", type=int, default=5, help="Failed attempts in a row before giving up (default 5).")
    parser.add_argument("--backoff", type=float, default=2.0, help="First retry delay in seconds, doubled each time (default 2).")
    parser.add_argument("--timeout", type=float, default=60.0, help="Socket timeout in seconds (default 60).")
    parser.add_argument("--keep-archives", action="store_true", help="Keep the zip files after extraction.")
    parser.add_argument("--no-checksum", action="store_true", help="Skip the MD5 check (size and zip CRCs are still checked).")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    outputs = download_dataset(args.dataset, args.dest, url_base=args.url_base, retries=args.retries,
                               backoff=args.backoff, timeout=args.timeout, keep_archives=args.keep_archives,
                               check_md5=not args.no_checksum)
    for key, path in outputs.items():
        print(f"{key}: {path}")
