from pgoverlay.cli import main

raise SystemExit(main())
