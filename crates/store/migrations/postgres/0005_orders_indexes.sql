-- Only the indexes that queries use: no query filters orders by status (the service reads a
-- sale's orders by sku_id, which the unique key orders_request leads with, and one order by
-- order_no), so orders_sku_status only cost a B-tree write per inserted order and per status
-- change. Same change as migrations/mysql/0005_orders_indexes.sql.
DROP INDEX orders_sku_status;
