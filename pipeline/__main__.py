from pipeline.cli import run

run()
