"""Stage `explore`: the instance explorer, one self-contained HTML page per cache
(``ladbench.report.explorer``; docs/formats.md §7), and its index.

    ladbench explore        one page from a cache, the calibration and the evaluation
    ladbench explore-index  the index of several pages, from their evaluations
"""

from __future__ import annotations

import argparse

from ladbench.cli import output_file
from ladbench.report.explorer import Thumbnails

__all__ = ["register"]


def register(subparsers) -> None:
    """Add the ``explore`` and ``explore-index`` subcommands."""
    parser = subparsers.add_parser(
        "explore", help="an instance explorer page (self-contained HTML) from a cache, calibration and evaluation",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", required=True, help="inference cache (HDF5) of a scoring prompt variant")
    parser.add_argument("--calibration", required=True,
                        help="the calibration .npz the evaluation made its predictions with (its first draw)")
    parser.add_argument("--evaluation", required=True, help="evaluation JSON of the cache (its .npz beside it)")
    parser.add_argument("--benchmark", default=None,
                        help="benchmark JSON (captions; default: the path the cache records, checked by its digest)")
    parser.add_argument("--images", default=None,
                        help="image table (images.json) for the thumbnails; without it the page shows image ids")
    parser.add_argument("--thumbnail-size", type=int, default=Thumbnails.size, help="thumbnail longest side, px")
    parser.add_argument("--thumbnail-quality", type=int, default=Thumbnails.quality, help="thumbnail JPEG quality")
    parser.add_argument("--out", required=True, type=output_file(".html"), help="output page (.html)")
    parser.set_defaults(func=run)

    index = subparsers.add_parser("explore-index", help="the index of the explorer pages, filterable by setting")
    index.add_argument("--pages", nargs="+", required=True, help="explorer pages, in the order of --evaluations")
    index.add_argument("--evaluations", nargs="+", required=True, help="each page's evaluation JSON")
    index.add_argument("--out", required=True, type=output_file(".html"), help="output index (.html)")
    index.set_defaults(func=run_index)


def run(args: argparse.Namespace) -> None:
    from ladbench.report.explorer import explorer_document, write_explorer

    document = explorer_document(args.cache, args.calibration, args.evaluation, benchmark_path=args.benchmark,
                                 images_path=args.images,
                                 thumbnails=Thumbnails(args.thumbnail_size, args.thumbnail_quality), progress=True)
    write_explorer(document, args.out)
    print(f"wrote {args.out}: {document['n_instances']} instances x {document['n_orderings']} orderings, "
          f"{len(document['thumbnails'])} thumbnails")


def run_index(args: argparse.Namespace) -> None:
    from ladbench.report.explorer import write_explorer_index

    if len(args.pages) != len(args.evaluations):
        raise ValueError(f"--pages lists {len(args.pages)} pages but --evaluations {len(args.evaluations)} files; "
                         "give one evaluation per page")
    write_explorer_index(list(zip(args.pages, args.evaluations)), args.out)
    print(f"wrote {args.out}: {len(args.pages)} pages")
