"""Start and stop a local autoscaling raylog cluster: a checkout's shortcut to
:mod:`raylog.tools.local_cluster` (``python -m raylog.tools.local_cluster``
does the same from an installed package)::

    .venv/bin/python deploy/local_cluster.py start [--disk-nodes 2]
    .venv/bin/python deploy/local_cluster.py status
    .venv/bin/python deploy/local_cluster.py stop
"""

import sys

from raylog.tools.local_cluster import main

if __name__ == "__main__":
    sys.exit(main())
