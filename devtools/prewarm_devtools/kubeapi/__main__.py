"""Serve the embedded Kubernetes API server until Ctrl-C.

python -m prewarm_devtools.kubeapi --seed samplefiles/cluster.yaml [--nodes N] [--port P] [--cluster-name NAME]
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from prewarm_devtools.kubeapi.registry import SeedError
from prewarm_devtools.kubeapi.server import ANONYMOUS_MODES, KubeApiServer
from prewarm_devtools.kubeapi.synthetic import generate_cluster


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m prewarm_devtools.kubeapi",
        description="Serve a local Kubernetes API (core/v1) on 127.0.0.1 until Ctrl-C.",
    )
    parser.add_argument(
        "--seed", action="append", default=[], metavar="FILE", help="YAML or JSON objects to load (repeatable)"
    )
    parser.add_argument("--nodes", type=int, default=0, metavar="N", help="also generate N synthetic EKS nodes")
    parser.add_argument("--pods-per-node", type=int, default=0, metavar="N", help="with --nodes: N pods on each node")
    parser.add_argument("--random-seed", type=int, default=0, metavar="S", help="seed of the synthetic cluster")
    parser.add_argument("--port", type=int, default=0, metavar="P", help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--token", default=None, help="the cluster admin's bearer token (default: a random one)")
    parser.add_argument("--kubeconfig", default=None, metavar="PATH", help="write a kubeconfig for the server here")
    parser.add_argument(
        "--tls", action="store_true",
        help="serve HTTPS with a CA made at start (in the kubeconfig): kubectl sends its token over TLS only",
    )
    parser.add_argument(
        "--cluster-name", default="local", metavar="NAME",
        help="the EKS cluster this plays (default: local, as local mode names its own): an EKS token must be "
        "signed for it, as `aws eks get-token --cluster-name NAME` signs, else 401",
    )
    parser.add_argument(
        "--anonymous",
        choices=ANONYMOUS_MODES,
        default="unauthorized",
        help="requests without a token: 401 (default), system:anonymous as on EKS, or the cluster admin "
        "(kubectl sends no token over plain HTTP: prefer --tls)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.nodes < 0 or args.pods_per_node < 0:
        print("--nodes and --pods-per-node must not be negative", file=sys.stderr)
        return 2
    api = KubeApiServer(port=args.port, token=args.token, anonymous=args.anonymous, tls=args.tls,
                        cluster_name=args.cluster_name)
    try:
        for path in args.seed:
            count = api.seed_from_file(path)
            print(f"seeded {count} objects from {path}")
        if args.nodes:
            count = api.seed_objects(generate_cluster(args.nodes, args.random_seed, pods_per_node=args.pods_per_node))
            print(f"seeded {count} synthetic objects ({args.nodes} nodes)")
    except SeedError as e:
        print(f"cannot seed: {e}", file=sys.stderr)
        return 1
    try:
        api.start()
    except OSError as e:
        print(f"cannot listen on 127.0.0.1:{args.port}: {e.strerror}", file=sys.stderr)
        return 1
    stop = threading.Event()
    # Explicit handlers: a shell starting us in the background would have SIGINT ignored.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"Kubernetes API: {api.url}")
    print(f"Bearer token:   {api.token} (cluster admin)")
    print(f"EKS tokens:     signed for cluster {args.cluster_name}")
    if args.kubeconfig:
        print(f"kubeconfig:     {api.write_kubeconfig(args.kubeconfig)}")
        if not args.tls and args.anonymous != "allowed":
            print("(kubectl sends no token over plain HTTP: start with --tls to use it)")
    print("Ctrl-C to stop.", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        api.stop()
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
