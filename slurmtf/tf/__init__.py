"""TensorFlow's side of slurmtf, and every difference between the TensorFlow releases it
supports, each detected by its feature (docs/TENSORFLOW_VERSIONS.md, "Differences handled"):

- ``cluster_resolver``: the ``ClusterResolver`` over a ``ClusterLayout``.
- ``lean_import``: TensorFlow without Keras, for processes that build no model; Keras
  without its extras, for a model's ranks.
- ``collectives``: collective keys reused, for flat memory over long runs; variables
  created without a broadcast each.
- ``compat``: what differs between Keras 2 and Keras 3 (and among Keras 3 releases) in
  the APIs the training loop, ``model.fit`` and the export use; Keras 3 itself.
- ``coordination``: the coordination service (its config module, the registration
  barrier, the ServerDef a process joined with).
- ``join_deadline``: the bound on joining where a release has no registration barrier.
- ``keras_compat``: Keras 3 ``fit`` under MultiWorkerMirroredStrategy.
- ``fit_resume``: a ``fit`` resumed mid-epoch drops the batches that epoch trained.
- ``keras_distribute``: older Keras 3 releases under ``tf.distribute``.
- ``releases``: which releases are tested and what each carries.
- ``install``: the one line for an installed TensorFlow that will not do.

A function (or class) that handles a release difference is named in its module's
``RELEASE_DIFFERENCES`` (``compat`` and ``coordination`` hold nothing else), and the
table names each of them (tests/test_tf_differences.py).

May import: ``slurmtf.cluster`` and the vocabulary (``errors``, ``events``). Importing
this package imports no TensorFlow; ``cluster_resolver`` does (it subclasses
TensorFlow's ``ClusterResolver``, so ``slurmtf.resolver`` imports it lazily), the others
only when their functions run.
"""
