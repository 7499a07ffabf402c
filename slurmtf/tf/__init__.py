"""TensorFlow's side: the ``ClusterResolver`` over a ``ClusterLayout``
(``cluster_resolver``), TensorFlow without Keras (``lean_import``), the fixes armed
before training (``collectives``: flat memory over long runs; ``keras_compat``: Keras 3
``fit`` under MultiWorkerMirroredStrategy; ``keras_distribute``: older Keras 3 releases
under ``tf.distribute``), and the TensorFlow releases: which are tested and what each
carries (``releases``), the one line for an installed TensorFlow that will not do
(``install``), and everything that differs between them, detected by feature (``compat``).

May import: ``slurmtf.cluster`` and the vocabulary. Importing this package imports no
TensorFlow; ``cluster_resolver`` does (it subclasses TensorFlow's ``ClusterResolver``,
so ``slurmtf.resolver`` imports it lazily), the others only when their functions run.
"""
