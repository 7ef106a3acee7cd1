"""``python -m app``: the studio."""

from app.main import main

raise SystemExit(main())
