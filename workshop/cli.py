"""``workshop``: the course's command line (model preparation, benchmarks, serving)."""

from __future__ import annotations

import argparse
import sys


def _model_prepare(args: argparse.Namespace) -> int:
    from reference_server.models import prepare_model
    folder = prepare_model(force=args.force)
    print(folder)
    return 0


def _model_path(args: argparse.Namespace) -> int:
    from reference_server.models import resolve_model
    print(resolve_model(args.model, prepare=False).path)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from reference_server.__main__ import main as serve
    serve(args.server_args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from workshop.bench.cli import add_subcommands as add_bench

    parser = argparse.ArgumentParser(prog="workshop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="the bundled model and other models")
    msub = model.add_subparsers(dest="model_command", required=True)
    prep = msub.add_parser("prepare", help="convert the bundled SmolLM2 GGUF into a Hugging "
                           "Face folder (once; offline)")
    prep.add_argument("--force", action="store_true", help="convert again even if prepared")
    prep.set_defaults(func=_model_prepare)
    path = msub.add_parser("path", help="print where a model's weights are")
    path.add_argument("model", nargs="?", default="smollm2-135m")
    path.set_defaults(func=_model_path)

    serve = sub.add_parser("serve", help="run the reference server (same flags as "
                           "`python -m reference_server`)", add_help=False)
    serve.add_argument("server_args", nargs=argparse.REMAINDER)
    serve.set_defaults(func=_serve)

    add_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(args.func(args) or 0)


if __name__ == "__main__":
    main()
