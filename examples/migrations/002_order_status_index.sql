-- Open orders are looked up by status on the fulfilment dashboard.
CREATE INDEX orders_open_by_placed_at ON orders (placed_at)
    WHERE status IN ('pending', 'paid');

CREATE VIEW open_orders AS
SELECT o.id, o.placed_at, o.total, c.email
  FROM orders o JOIN customers c ON c.id = o.customer_id
 WHERE o.status IN ('pending', 'paid');
