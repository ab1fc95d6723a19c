from leantrain.cli import main

raise SystemExit(main())
