"""``db_input``: a ``CreateDB`` reader named ``dbreader_<db>`` in the init net and a
``TensorProtosDBInput`` op reading ``batch_size`` records into ``blobs_out``."""

__all__ = ["db_input"]


def db_input(model, blobs_out, batch_size, db, db_type):
    dbreader = model.param_init_net.CreateDB([], "dbreader_" + db, db=db, db_type=db_type)
    return model.net.TensorProtosDBInput(dbreader, blobs_out, batch_size=batch_size)
