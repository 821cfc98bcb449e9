-- Stock buckets: how many hot copies a sale's stock is split over (1..=64; 1, the default,
-- is one hot copy, the layout of every sale before this column). An expand migration: a
-- binary that does not know the column writes sales of one bucket, as it always did.
ALTER TABLE sales ADD COLUMN buckets INTEGER NOT NULL DEFAULT 1
    CHECK (buckets BETWEEN 1 AND 64);
