"""A ``[sink] transform``'s executor side: what only a transform's read and write tasks run.

feed.py makes the read tasks a DataFrame (``mapInArrow``): each reads its ranges as the
built-in path does (executor/consume.py, formats/encode.py) and hands the good records over
as typed Arrow batches (typed_rows.py: COPY text lines read in Arrow, arrow_rows.py, or a
json batch's values as columns, arrow_columns.py). writer.py stages the transform's output
(a second ``mapInArrow``) as COPY binary tuples (arrow_binary.py) or text lines
(arrow_copy.py) through the built-in staging skeleton (executor/stage.py).
worker_imports.py keeps pandas out of these workers when no user Python runs there.
"""
