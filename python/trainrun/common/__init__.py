"""trainrun.common: what Horovod keeps in horovod.common (its exceptions, the elastic loop) for
every framework binding, under the same names, so Horovod scripts port by the import."""
