"""The CLI's commands, one module per command group (run + init-db, backfill, lag, offsets,
runs, unlock, verify). Each owns its arguments, handler and output, and exposes ``register(sub)``,
which adds its parser(s) to the ``pipeline`` subparsers with ``handler(args, settings) ->
exit code`` as a default. Shared: ``args`` (parser, argument types, --help layout) and
``output`` (the table renderer, JSON). Commands never import pipeline.cli. Handlers import
the Kafka, Postgres and Spark code when they run, so that --help and a bad argument answer
without loading it."""
