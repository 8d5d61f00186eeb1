
seed-idsdavedigits