import sys

if sys.argv[1:2] == ["relay"]:  # an endpoint's own server behind a unix socket (relay.py)
    from .relay import main as relay

    sys.exit(relay(sys.argv[2:]))

from .serve import main

sys.exit(main())
