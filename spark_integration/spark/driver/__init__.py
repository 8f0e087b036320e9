"""The driver side of a ``rhino.spark`` operator, one stage per module (the facade is
``rhino.spark.operator.TransformWithState``; a batch's steps are in ``batch.py``)."""
