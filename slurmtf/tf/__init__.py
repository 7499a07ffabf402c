"""TensorFlow's side: the ``ClusterResolver`` over a ``ClusterLayout``
(``cluster_resolver``), TensorFlow without Keras (``lean_import``), and the fixes armed
before training (``collectives``: flat memory over long runs; ``keras_compat``: Keras 3
``fit`` under MultiWorkerMirroredStrategy).

May import: ``slurmtf.cluster`` and the vocabulary. Importing this package imports no
TensorFlow; ``cluster_resolver`` does (it subclasses TensorFlow's ``ClusterResolver``,
so ``slurmtf.resolver`` imports it lazily), the others only when their functions run.
"""
