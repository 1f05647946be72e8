"""``tailguard validate FILE.yaml [--models]``: check a spec the way the API server would and
print it defaulted, as YAML that can be applied again; ``--models`` also loads both models."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    """Register ``validate`` on the ``tailguard`` subcommands."""
    text = "check an InferenceService YAML exactly as the API server would"
    validate = sub.add_parser("validate", help=text, description=(
        "Check an InferenceService YAML exactly as the API server would (schema, defaults, CEL "
        "rules) and print it as YAML with every default filled in, ready to apply again."))
    validate.add_argument("file", help="InferenceService YAML, as given to kubectl apply")
    validate.add_argument("--models", action="store_true",
                          help="also load both models and check that the fallback is a drop-in "
                               "for the primary (same features, same classes)")
    validate.set_defaults(func=_validate)


def _validate(args: argparse.Namespace) -> int:
    import yaml

    from tailguard.operator.manifests import cluster_problems
    from tailguard.spec.resource import as_applied, read_file
    from tailguard.spec.schema import SpecError

    try:
        found = read_file(args.file)
    except OSError as exc:
        print(f"tailguard validate: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    except SpecError as exc:
        print(exc.for_people("tailguard validate", args.file), file=sys.stderr)
        return 2
    isvc = found.isvc
    if args.models and not _check_models(args.file, isvc):
        return 1
    print(yaml.safe_dump(as_applied(found.written, isvc), sort_keys=False), end="")
    for line in cluster_problems(isvc):
        print(f"note: valid for tailguard up, but the operator refuses it: {line}", file=sys.stderr)
    if not args.models:
        print("note: models not loaded (a file:// or pvc:// model may live in an image or on a "
              "volume of the cluster); --models "
              "loads both and checks that the fallback is a drop-in", file=sys.stderr)
    return 0


def _check_models(path: str, isvc: Any) -> bool:
    """Load both models as ``tailguard up`` does; print one line either way."""
    from tailguard_runtime.errors import ModelLoadError
    from tailguard_runtime.service import load_predictors

    try:
        predictors = load_predictors(isvc.runtime_settings())
    except ModelLoadError as exc:
        print(f"tailguard validate: {path}: {exc}", file=sys.stderr)
        return False
    primary, fallback = predictors["primary"], predictors["fallback"]
    classes = "" if primary.classes is None else f", {len(primary.classes)} classes"
    print(f"models: primary {primary.estimator_type} and fallback {fallback.estimator_type} "
          f"load; the fallback is a drop-in ({primary.n_features} features{classes})",
          file=sys.stderr)
    return True
