"""An import shim: `import horovod.torch` resolves to trainrun.torch. It implements nothing."""
