"""The remote store: checkpoints and suspended sandboxes as content-addressed chunks in S3-compatible
object storage, so that another node can restore or resume them."""
